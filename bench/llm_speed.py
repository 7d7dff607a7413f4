"""Speed features on the embedded SmolLM2 (or --model PATH): none/int8/int4, with and without speculation.

One run, one table: time to first token for a chat prompt, greedy decode tokens/s, speculative
acceptance, weight bytes read per decode token, measured copy bandwidth and the % of the bandwidth bound,
beside transformers `generate` on the same weights (and llama-cpp-python if it is importable).
Usage: .venv/bin/python bench/llm_speed.py [--tokens 48] [--threads N] [--compile]
"""
from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from llm_engine.gguf_quant import read_quantized_linears  # noqa: E402
from llm_engine.kv_cache import StaticKVCache  # noqa: E402
from llm_engine.loader import load_model  # noqa: E402
from llm_engine.model import Transformer  # noqa: E402
from llm_engine.quantize import quantize_model, weight_bytes_per_token  # noqa: E402
from llm_engine.request import SamplingParams  # noqa: E402
from llm_engine.speculative import SpeculativeDecoder, draft_cache_like, make_self_draft  # noqa: E402
from llm_engine.tokenizer import ChatMessage, Tokenizer  # noqa: E402

MAX_SEQ = 512
PROMPT = "Tell me a short story about a lighthouse keeper and a storm."


def copy_bandwidth_gb_s(mib: int = 512, repeats: int = 5) -> float:
    """Best of a few large copies: read + write bytes per second, the ceiling a decode step can reach."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def cache_for(model: Transformer) -> StaticKVCache:
    c = model.cfg
    return StaticKVCache(c.num_layers, 1, c.num_kv_heads, MAX_SEQ, c.head_dim)


@torch.inference_mode()
def run_plain(model: Transformer, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    """-> (ttft_ms, decode tok/s, tokens) greedy, one request, slot 0."""
    cache = cache_for(model)
    t0 = time.perf_counter()
    logits = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, [0])
    out = [int(logits[0, -1].argmax())]
    ttft = time.perf_counter() - t0
    pos = len(prompt)
    t1 = time.perf_counter()
    while len(out) < n:
        logits = model(torch.tensor([[out[-1]]]), torch.tensor([[pos]]), cache, [0], kv_len=pos + 1)
        out.append(int(logits[0, -1].argmax()))
        pos += 1
    return 1000 * ttft, (n - 1) / (time.perf_counter() - t1), out


@torch.inference_mode()
def run_speculative(model: Transformer, draft: Transformer, prompt: list[int], n: int) -> tuple[float, float, list[int], float]:
    cache = cache_for(model)
    dec = SpeculativeDecoder(model, draft, cache, draft_cache_like(draft, cache), k=4)
    t0 = time.perf_counter()
    logits = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, [0])
    dec.prefill_draft(0, prompt)
    out = [int(logits[0, -1].argmax())]
    ttft = time.perf_counter() - t0
    pos = len(prompt)
    t1 = time.perf_counter()
    while len(out) < n:
        new = dec.step(0, out[-1], pos, SamplingParams())
        pos += len(new)
        out.extend(new)
    return 1000 * ttft, (len(out) - 1) / (time.perf_counter() - t1), out[:n], dec.stats.acceptance_rate


def run_transformers(folder: Path, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, len(prompt):].tolist()
        total = time.perf_counter() - t1
    return 1000 * ttft, (n - 1) / max(total - ttft, 1e-9), out


_LLAMA_CHILD = """
import json, sys, time
from llama_cpp import Llama
gguf, n, threads, n_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompt = json.loads(sys.stdin.read())
llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_batch=n_batch, n_ubatch=n_batch, verbose=False)
llm.create_completion(prompt, max_tokens=1, temperature=0.0)  # warm-up
llm.reset()  # forget the cached prompt so the timed run prefills it like ours does
no_eos = {llm.token_eos(): -1e9}  # decode exactly n tokens, as the other rows do
t0 = time.perf_counter()
first, count = None, 0
for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True, logit_bias=no_eos):
    count += 1
    if first is None:
        first = time.perf_counter()
end = time.perf_counter()
print(json.dumps([1000 * (first - t0), (count - 1) / max(end - first, 1e-9)]))
"""


def run_llama_cpp(gguf: Path, prompt: list[int], n: int) -> tuple[float | None, float] | str:
    """-> (ttft_ms or None, tok/s), or why there is no row. Runs in a child process: on this VM the
    natively built llama.cpp crashes (SIGSEGV) in its batched prompt kernels, which would take the
    whole benchmark down; then it is retried with one-token batches, whose TTFT is not comparable."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("llama_cpp") is None:
        return "not installed"
    for n_batch in (512, 1):
        proc = subprocess.run(
            [sys.executable, "-c", _LLAMA_CHILD, str(gguf), str(n), str(torch.get_num_threads()), str(n_batch)],
            input=json.dumps(prompt), capture_output=True, text=True, timeout=600,
        )
        if proc.returncode == 0:
            ttft, tps = json.loads(proc.stdout.strip().splitlines()[-1])
            return (ttft if n_batch > 1 else None), tps
    return f"failed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="a .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from web.locate import find_embedded

        args.model = find_embedded("llm")
    model, folder = load_model(args.model, max_seq_len=MAX_SEQ)
    prompt = Tokenizer.from_folder(folder).apply_chat_template([ChatMessage("user", PROMPT)])
    n = args.tokens
    bw = copy_bandwidth_gb_s()
    print(f"model {args.model.name}  prompt {len(prompt)} tokens  decode {n} tokens  threads {torch.get_num_threads()}  "
          f"copy bandwidth {bw:.1f} GB/s  load avg {os.getloadavg()[0]:.1f}")  # fmt: skip

    variants: dict[str, Transformer] = {"none (fp32)": model}
    # Speculation rows: the draft is an int4 copy of every layer, so on CPU each draft token costs about
    # as much Python/dispatch time as a target token; the rows show the acceptance and what that costs.
    variants["int8"] = quantize_model(copy.deepcopy(model), "int8")
    gguf_layers = read_quantized_linears(args.model, "int4") if args.model.suffix == ".gguf" else {}
    variants["int4 (Q4_1 blocks)"] = quantize_model(copy.deepcopy(model), "int4", replacements=gguf_layers)
    draft = make_self_draft(model, scheme="int4")

    print(f"{'variant':66s} {'TTFT ms':>8s} {'tok/s':>7s} {'greedy':>10s} {'MB/token':>9s} {'% of BW bound':>13s}")
    rows: list[tuple[str, float, float, str, int]] = []

    def show(name: str, ttft: float, tps: float, same: str, nbytes: int) -> None:
        """Each row prints as soon as it is measured: a slow, shared machine still leaves a partial table."""
        rows.append((name, ttft, tps, same, nbytes))
        print(f"{name:66s} {ttft:8.1f} {tps:7.1f} {same:>10s} {nbytes / 1e6:9.1f} {100 * tps * nbytes / (bw * 1e9):12.1f}%", flush=True)

    reference: list[int] | None = None
    for name, m in variants.items():
        run_plain(m, prompt[:8], 4)  # warm-up: kernel layouts, allocator
        ttft, tps, out = run_plain(m, prompt, n)
        reference = reference or out
        same = "=" if out == reference else f"differs@{next(i for i, (a, b) in enumerate(zip(out, reference)) if a != b)}"
        show(name, ttft, tps, same, weight_bytes_per_token(m))
        ttft, tps, sout, acc = run_speculative(m, draft, prompt, n)
        show(f"{name} + spec(int4 self-draft, k adaptive) acc {acc:.2f}", ttft, tps,
             "=" if sout == out else "MISMATCH", weight_bytes_per_token(m) + weight_bytes_per_token(draft))  # fmt: skip
    if not args.skip_transformers:
        ttft, tps, hout = run_transformers(folder, prompt, n)
        show("transformers generate (fp32, same weights)", ttft, tps, "=" if hout == reference else "differs", weight_bytes_per_token(model))
    lc = run_llama_cpp(args.model, prompt, n)
    if isinstance(lc, str):
        print(f"{'llama.cpp (llama-cpp-python)':66s} {lc}")
    else:
        ttft = f"{lc[0]:8.1f}" if lc[0] is not None else "     n/a"  # n/a: prompt fed one token at a time
        print(f"{'llama.cpp (llama-cpp-python, same GGUF)':66s} {ttft} {lc[1]:7.1f}")
    print("greedy '=': same tokens as the fp32 row (speculative rows: same as their own target).")


if __name__ == "__main__":
    main()
