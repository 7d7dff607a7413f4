"""Decode speed per CPU class, measured on this one: the compiled step built for this CPU and for AVX2 (x86-64-v3),
with its int8-input kernels and with the float kernels the AVX2 build took before them, beside llama.cpp.

A process loads the compiled library once, so each (build, kernel) runs in a child process with PARLEY_NATIVE_MARCH
set; the classes alternate, `--runs` rounds, and the table shows medians (min-max). llama.cpp rows come from the
llama-cpp-python importable here (built for this CPU) and, with `--llama-avx2 DIR`, from one built into DIR for AVX2
only (`CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF ..." pip install --target DIR
llama-cpp-python`), run with DIR first on PYTHONPATH.
Usage: HF_HUB_OFFLINE=1 .venv/bin/python -m bench.cpu_classes [--models embedded-0.5b,embedded-1.5b] [--runs 3]
       [--tokens 32] [--llama-avx2 /tmp/llama-avx2] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = list(range(1000, 1040))

# (label, PARLEY_NATIVE_MARCH, int8_dot for NativeDecoder)
OURS = (
    ("ours, this CPU's build", "native", None),
    ("ours, AVX2 build, int8-input kernels", "x86-64-v3", None),
    ("ours, AVX2 build, float kernels (before)", "x86-64-v3", False),
)


def _child(model: str, int8_dot: str, tokens: int) -> None:
    """Prints one JSON line: decode tok/s (the better of two runs) and what the step ran on."""
    import torch

    from bench.llm_speed import cache_for, run_plain
    from llm_engine.native.build import load
    from llm_engine.native.decoder import NativeDecoder, kernels_used
    from llm_engine.prepare import prepare
    from llm_engine.threads import on_own_thread

    dot = None if int8_dot == "None" else False
    path = _path(model)
    m = on_own_thread(lambda: prepare(path, device="cpu", dtype="float32", max_seq_len=512, quant="int4", group_size=32,
                                      self_draft="none", kv_cache="auto").model)  # fmt: skip
    kernel = NativeDecoder(m, cache_for(m), int8_dot=dot).int8_kernel
    on_own_thread(lambda: run_plain(m, PROMPT[:8], 4, compiled=True, int8_dot=dot))  # warm-up
    rate = max(on_own_thread(lambda: run_plain(m, PROMPT, tokens, compiled=True, int8_dot=dot))[1] for _ in range(2))
    print(json.dumps({"tps": rate, "features": load().parley_features(), "kernels": kernels_used(m, kernel),
                      "threads": torch.get_num_threads()}))  # fmt: skip


def _path(model: str) -> Path:
    from parley.locate import find_embedded

    return Path(model) if model.endswith(".gguf") else find_embedded("llm", model)


def _ours(model: str, march: str, int8_dot: bool | None, tokens: int) -> dict:
    env = {**os.environ, "PARLEY_NATIVE_MARCH": march}
    proc = subprocess.run([sys.executable, "-m", "bench.cpu_classes", "--child", model, str(int8_dot), "--tokens", str(tokens)],
                          env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _llama(model: str, tokens: int, pythonpath: str | None) -> float | str:
    from bench.llm_speed import _LLAMA_CHILD

    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    import torch

    proc = subprocess.run([sys.executable, "-c", _LLAMA_CHILD, str(_path(model)), str(tokens), str(torch.get_num_threads()), "512", "2048"],
                          input=json.dumps([PROMPT]), env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip()[-120:]}"
    return float(json.loads(proc.stdout.strip().splitlines()[-1])[0][1])


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni") if f in flags)


def table(models: list[str], runs: int, tokens: int, llama_avx2: str | None,
          ours: tuple[tuple[str, str, bool | None], ...] = OURS) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """Prints the table; -> model -> row label -> tok/s per run."""
    import importlib.util

    print(f"CPU features: {cpu_flags()}; {runs} alternating runs, {tokens} greedy tokens after a {len(PROMPT)}-token prompt")
    rows: list[tuple[str, object]] = [(label, (march, dot)) for label, march, dot in ours]
    if importlib.util.find_spec("llama_cpp") is not None:
        rows.append(("llama.cpp, this CPU's build", None))
    if llama_avx2:
        rows.append(("llama.cpp, AVX2 build", llama_avx2))
    found: dict[str, dict[str, list[float]]] = {}
    for model in models:
        rates: dict[str, list[float]] = {label: [] for label, _ in rows}
        kernels: dict[str, str] = {}
        for _ in range(runs):
            for label, how in rows:
                if isinstance(how, tuple):
                    got = _ours(model, how[0], how[1], tokens)
                    if "error" in got:
                        kernels[label] = got["error"]
                        continue
                    rates[label].append(got["tps"])
                    kernels[label] = f"features {got['features']}: {got['kernels']}"
                else:
                    got_l = _llama(model, tokens, how)
                    if isinstance(got_l, str):
                        kernels[label] = got_l
                    else:
                        rates[label].append(got_l)
        found[model] = rates
        print(f"\n{model}")
        print(f"{'':44s} {'tok/s median (min-max)':>24s} {'vs llama.cpp AVX2':>18s} {'vs llama.cpp here':>18s}  kernels")
        ref_avx2 = statistics.median(rates["llama.cpp, AVX2 build"]) if rates.get("llama.cpp, AVX2 build") else None
        ref_here = statistics.median(rates["llama.cpp, this CPU's build"]) if rates.get("llama.cpp, this CPU's build") else None
        for label, _ in rows:
            r = rates[label]
            if not r:
                print(f"{label:44s} {'-':>24s}  {kernels.get(label, '')}")
                continue
            med = statistics.median(r)
            cell = f"{med:.1f} ({min(r):.1f}-{max(r):.1f})"
            a = f"{med / ref_avx2:.2f}x" if ref_avx2 else "-"
            h = f"{med / ref_here:.2f}x" if ref_here else "-"
            print(f"{label:44s} {cell:>24s} {a:>18s} {h:>18s}  {kernels.get(label, '')}", flush=True)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="embedded-0.5b,embedded-1.5b", help="embedded names or .gguf paths, comma-separated")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--llama-avx2", default=None, help="a folder with llama-cpp-python built for AVX2 only")
    p.add_argument("--tiny", action="store_true", help="the AVX2 build's two rows, one run of 8 tokens on the 135M: the suite's check")
    p.add_argument("--child", nargs=2, metavar=("MODEL", "INT8_DOT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.tokens)
        return
    if args.tiny:
        table(["embedded-135m"], 1, 8, None, OURS[1:])
        return
    table(args.models.split(","), args.runs, args.tokens, args.llama_avx2)


if __name__ == "__main__":
    main()
