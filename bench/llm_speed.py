"""Measurements behind bench/llm.py's table: one greedy request (torch eager, compiled step or speculative) on a bare model,
transformers `generate`, llama.cpp in a child process, and the machine's copy bandwidth.

Each returns (time to first token ms, decode tokens/s, tokens); the table and its ratios live in llm.py.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from llm_engine.kv_cache import StaticKVCache  # noqa: E402
from llm_engine.prepare import resolve_kv_dtype  # noqa: E402
from llm_engine.model import Transformer  # noqa: E402
from llm_engine.request import SamplingParams  # noqa: E402
from llm_engine.speculative import SpeculativeDecoder, draft_cache_like  # noqa: E402

MAX_SEQ = 512


def llm_path(arg: str | Path | None) -> Path:
    """--model as given, else the embedded SmolLM2 GGUF."""
    if arg:
        return Path(arg)
    from parley.locate import find_embedded

    return find_embedded("llm", "embedded-135m")


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
    """A one-slot cache of the element type the engine would give this model (float16 on CPU)."""
    c = model.cfg
    dtype = resolve_kv_dtype("auto", next(model.parameters()).dtype, "cpu")
    return StaticKVCache(c.num_layers, 1, c.num_kv_heads, MAX_SEQ, c.head_dim, dtype=dtype)


@torch.inference_mode()
def run_plain(
    model: Transformer, prompt: list[int], n: int, *, compiled: bool = False, int8_dot: bool | str | None = None
) -> tuple[float, float, list[int]]:
    """-> (ttft_ms, decode tok/s, tokens) greedy, one request, slot 0. compiled: decode steps through the
    compiled CPU step (llm_engine/native, its int8_dot as NativeDecoder's); the prefill is torch either way."""
    cache = cache_for(model)
    if compiled:
        from llm_engine.native.decoder import NativeDecoder

        native = NativeDecoder(model, cache, int8_dot=int8_dot)
        step = lambda token, pos: native.decode([token], [pos], [0])[0]  # noqa: E731
    else:
        step = lambda token, pos: model(torch.tensor([[token]]), torch.tensor([[pos]]), cache, [0], kv_len=pos + 1)[0, -1]  # noqa: E731
    t0 = time.perf_counter()
    logits = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, [0])
    out = [int(logits[0, -1].argmax())]
    ttft = time.perf_counter() - t0
    pos = len(prompt)
    t1 = time.perf_counter()
    while len(out) < n:
        out.append(int(step(out[-1], pos).argmax()))
        pos += 1
    return 1000 * ttft, (n - 1) / (time.perf_counter() - t1), out


@torch.inference_mode()
def native_rate_at(model: Transformer, positions: list[int], kv_dtype: torch.dtype, steps: int = 32) -> list[float]:
    """Compiled-step tokens/s with this many cached positions (best of three runs of `steps` steps at that
    position: the cache contents do not change the work, only its length does)."""
    from llm_engine.native.decoder import NativeDecoder

    c = model.cfg
    cache = StaticKVCache(c.num_layers, 1, c.num_kv_heads, max(positions) + 1, c.head_dim, dtype=kv_dtype)
    native = NativeDecoder(model, cache)
    rates = []
    for pos in positions:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(steps):
                native.decode([1], [pos], [0])
            best = min(best, time.perf_counter() - t0)
        rates.append(steps / best)
    return rates


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
gguf, n, threads, n_batch, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
prompts = json.loads(sys.stdin.read())
llm = Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_batch=n_batch, n_ubatch=n_batch, verbose=False)
llm.create_completion(prompts[0][:8], max_tokens=1, temperature=0.0)  # warm-up
no_eos = {llm.token_eos(): -1e9}  # decode exactly n tokens, as the other rows do
best = []
for prompt in prompts:
    runs = []
    for _ in range(2):  # the better of two, as for our rows: the less disturbed run
        llm.reset()  # forget the cached prompt so the timed run prefills it like ours does
        t0 = time.perf_counter()
        first, count = None, 0
        for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True, logit_bias=no_eos):
            count += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        runs.append([1000 * (first - t0), (count - 1) / max(end - first, 1e-9)])
    best.append(max(runs, key=lambda r: r[1]))
print(json.dumps(best))
"""


def _llama_cpp(gguf: Path, prompts: list[list[int]], n: int) -> list[tuple[float | None, float]] | str:
    """-> per prompt (ttft_ms or None, decode tok/s over n tokens), or why there are none. Runs in a child
    process: on this VM the natively built llama.cpp crashes (SIGSEGV) in its batched prompt kernels,
    which would take the whole benchmark down; then it is retried with one-token batches, whose TTFT is
    not comparable."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("llama_cpp") is None:
        return "not installed"
    n_ctx = max(2048, max(len(p) for p in prompts) + n + 1)
    for n_batch in (512, 1):
        proc = subprocess.run(
            [sys.executable, "-c", _LLAMA_CHILD, str(gguf), str(n), str(torch.get_num_threads()), str(n_batch), str(n_ctx)],
            input=json.dumps(prompts), capture_output=True, text=True, timeout=1200,
        )
        if proc.returncode == 0:
            found = json.loads(proc.stdout.strip().splitlines()[-1])
            return [((ttft if n_batch > 1 else None), tps) for ttft, tps in found]
    return f"failed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"


def run_llama_cpp(gguf: Path, prompt: list[int], n: int) -> tuple[float | None, float] | str:
    """llama.cpp on the same GGUF and prompt: (ttft_ms or None, tok/s), or why there is no row."""
    found = _llama_cpp(gguf, [prompt], n)
    return found if isinstance(found, str) else found[0]


def llama_cpp_rate_at(gguf: Path, text: list[int], positions: list[int], n: int = 32) -> list[float] | str:
    """llama.cpp's decode tokens/s for n tokens after a prompt of each length (`text` repeated to fill it),
    with its default float16 KV cache; or why there are none."""
    found = _llama_cpp(gguf, [(text * (p // len(text) + 1))[:p] for p in positions], n)
    return found if isinstance(found, str) else [tps for _, tps in found]
