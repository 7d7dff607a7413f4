"""Every CUDA check and benchmark of the LLM engine in one call (made for a short GPU loan; ~2-4 min on an H200).

Correctness: CUDA bf16/fp16 vs a CPU fp32 reference, graph replay vs eager, int8/int4 kernels vs their
CPU dequantized reference, speculative greedy vs plain greedy. Speed: a random-weight 1B-class Llama
(Llama-3.2-1B shape) at bf16/int8/int4, graphs off/on, speculation off/on, batch 8: tokens/s and the %
of the measured HBM copy bandwidth. Prints PASS/FAIL lines and one table; needs only torch and this repo.
Usage: python -m bench.gpu_check [--tokens 128]
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from dataclasses import replace
from typing import Callable

import torch

from llm_engine.config import ModelConfig
from llm_engine.cuda_graphs import GraphedDecoder
from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer
from llm_engine.quantize import quantize_model, weight_bytes_per_token
from llm_engine.request import SamplingParams
from llm_engine.speculative import SpeculativeDecoder, draft_cache_like, make_self_draft

SMALL = ModelConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=6, num_heads=8, num_kv_heads=4, head_dim=64)
ONE_B = ModelConfig(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
    head_dim=64, rope_theta=500000.0, tie_word_embeddings=True,
)  # fmt: skip
RESULTS: list[tuple[str, bool, str]] = []
DEV = "cuda"  # --cpu-dry-run switches to "cpu" with a small model: catches script bugs without a GPU


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], None]]:
    """Runs the check now; a failing assertion or error becomes a FAIL line (the script goes on to the next)."""

    def wrap(fn: Callable[[], str]) -> Callable[[], None]:
        t0 = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as exc:  # noqa: BLE001 - a check script reports every failure and carries on
            detail, ok = f"{type(exc).__name__}: {exc}".splitlines()[0][:200], False
            traceback.print_exc(limit=3)
        RESULTS.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        return fn

    return wrap


def random_model(cfg: ModelConfig, max_seq: int, device: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    with torch.device(device):
        m = Transformer(cfg, max_seq)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5 / cfg.hidden_size**0.5 if "embed" not in name else 1.0)
    return m.eval().requires_grad_(False)


def cache_for(m: Transformer, slots: int = 1) -> StaticKVCache:
    c, w = m.cfg, m.embed_tokens.weight
    return StaticKVCache(c.num_layers, slots, c.num_kv_heads, m.max_seq_len, c.head_dim, dtype=w.dtype, device=w.device)


@torch.inference_mode()
def greedy(m: Transformer, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    dev, cache = m.embed_tokens.weight.device, cache_for(m)
    logits = m(torch.tensor([prompt], device=dev), torch.arange(len(prompt), device=dev)[None], cache, [0])
    first = logits[0, -1].float().cpu()
    out, pos = [int(logits[0, -1].argmax())], len(prompt)
    while len(out) < n:
        logits = m(torch.tensor([[out[-1]]], device=dev), torch.tensor([[pos]], device=dev), cache, [0], kv_len=pos + 1)
        out.append(int(logits[0, -1].argmax()))
        pos += 1
    return out, first


def prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def decode_rate(step: Callable[[int, int], None], prompt_len: int, n: int) -> float:
    """tok/s of n calls of step(token, pos) after a warm-up (CUDA-synchronised)."""
    for i in range(3):
        step(1, prompt_len + i)
    sync()
    t0 = time.perf_counter()
    for i in range(n):
        step(1, prompt_len + i)
    sync()
    return n / (time.perf_counter() - t0)


def hbm_bandwidth_gb_s() -> float:
    src = torch.empty(2**30 if DEV == "cuda" else 2**27, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync()
    return 2 * src.numel() * 10 / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--cpu-dry-run", action="store_true", help="run the script's logic on CPU, small sizes, no graphs")
    args = ap.parse_args()
    global DEV, ONE_B
    if args.cpu_dry_run:
        DEV, ONE_B = "cpu", replace(SMALL, num_layers=2)
    elif not torch.cuda.is_available():
        print("FAIL  no CUDA device")
        sys.exit(1)
    print(f"torch {torch.__version__}  device {torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu (dry run)'}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    prompt = [5, 17, 300, 42, 1999, 7, 64, 128, 900, 3]
    ref_model = random_model(SMALL, 256, "cpu")
    ref_tokens, ref_first = greedy(ref_model, prompt, 24)

    for dtype in (torch.bfloat16, torch.float16):

        @check(f"CUDA {str(dtype)[6:]} vs CPU fp32 reference (small random Llama)")
        def _() -> str:
            m = copy.deepcopy(ref_model).to(DEV, dtype)
            toks, first = greedy(m, prompt, 24)
            err = float((first - ref_first).abs().max() / ref_first.abs().max())
            same = prefix_len(toks, ref_tokens)
            assert err < 3e-2 and toks[0] == ref_tokens[0], f"rel logit err {err:.3g}, first token {toks[0]} vs {ref_tokens[0]}"
            return f"rel logit err {err:.3g}, greedy agrees for {same}/24 tokens"

    for quant in ("none", "int8", "int4"):

        @check(f"CUDA {quant} bf16: eager vs CPU dequantized reference; graph replay == eager")
        def _() -> str:
            qcpu = quantize_model(copy.deepcopy(ref_model), quant, use_kernel=False)  # type: ignore[arg-type]
            _, want = greedy(qcpu, prompt, 1)
            q = copy.deepcopy(qcpu).to(DEV, torch.bfloat16)
            for mod in q.modules():
                if hasattr(mod, "use_kernel"):
                    mod.use_kernel = True
            toks, got = greedy(q, prompt, 8)
            err = float((got - want).abs().max() / want.abs().max())
            assert err < 3e-2, f"rel logit err {err:.3g}"
            cache_g, cache_e = cache_for(q, 3), cache_for(q, 3)
            with torch.inference_mode():
                for c in (cache_g, cache_e):
                    for s in range(3):
                        ids = prompt[: 4 + 2 * s]
                        q(torch.tensor([ids], device=DEV), torch.arange(len(ids), device=DEV)[None], c, [s])
                dec = GraphedDecoder(q, cache_g, buckets=(1, 4))
                worst = 0.0
                for step in range(4):
                    pos = [4 + step, 6 + step, 8 + step]
                    g = dec.decode([11, 12, 13], pos, [0, 1, 2]).float()
                    e = torch.cat([q(torch.tensor([[t]], device=DEV), torch.tensor([[p]], device=DEV), cache_e, [s], kv_len=p + 1)[:, -1]
                                   for t, p, s in zip([11, 12, 13], pos, [0, 1, 2])]).float()  # fmt: skip
                    worst = max(worst, float((g - e).abs().max() / e.abs().max()))
                    assert torch.equal(g.argmax(-1), e.argmax(-1)), f"graph argmax differs at step {step}"
            assert (dec.use_graphs or DEV == "cpu") and worst < 2e-2, f"graph vs eager rel err {worst:.3g}"
            return f"rel logit err vs CPU {err:.3g}; graph vs eager rel err {worst:.3g}"

    @check("speculative greedy (int4 self-draft) == plain greedy on CUDA bf16")
    def _() -> str:
        target = copy.deepcopy(ref_model).to(DEV, torch.bfloat16)
        plain, _ = greedy(target, prompt, 32)
        draft = make_self_draft(target, scheme="int4")
        cache = cache_for(target)
        dec = SpeculativeDecoder(target, draft, cache, draft_cache_like(draft, cache), k=4)
        with torch.inference_mode():
            logits = target(torch.tensor([prompt], device=DEV), torch.arange(len(prompt), device=DEV)[None], cache, [0])
        dec.prefill_draft(0, prompt)
        out, pos = [int(logits[0, -1].argmax())], len(prompt)
        while len(out) < 32:
            new = dec.step(0, out[-1], pos, SamplingParams())
            out, pos = out + new, pos + len(new)
        same = prefix_len(out[:32], plain)
        # bf16 verify rows (T = k+1) and single-row decode round differently: a flip at a near-tie is possible.
        assert same >= 16, f"agrees for only {same}/32"
        return f"agrees for {same}/32 tokens, acceptance {dec.stats.acceptance_rate:.2f}"

    bench(args.tokens)
    failed = [r for r in RESULTS if not r[1]]
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks PASS" + (f"; FAIL: {', '.join(r[0] for r in failed)}" if failed else ""))


def bench(n: int) -> None:
    bw = hbm_bandwidth_gb_s()
    print(f"\nHBM copy bandwidth {bw:.0f} GB/s; 1B-class random Llama (Llama-3.2-1B shape), decode {n} tokens after a 128-token prompt", flush=True)
    rows: list[tuple[str, float, int, int]] = []  # name, tok/s, weight bytes per step, tokens per step
    base = random_model(ONE_B, 512, DEV).to(torch.bfloat16)
    prompt_len = 128
    for quant in ("none", "int8", "int4"):

        @check(f"1B {quant} bf16 decode: eager, graph, graph batch 8")
        def _() -> str:
            m = base if quant == "none" else quantize_model(copy.deepcopy(base), quant)  # type: ignore[arg-type]
            nbytes = weight_bytes_per_token(m)
            cache = cache_for(m, 8)
            with torch.inference_mode():
                m(torch.randint(0, 1000, (1, prompt_len), device=DEV), torch.arange(prompt_len, device=DEV)[None], cache, [0])

                def eager(tok: int, pos: int) -> None:
                    m(torch.tensor([[tok]], device=DEV), torch.tensor([[pos]], device=DEV), cache, [0], kv_len=pos + 1)

                r_eager = decode_rate(eager, prompt_len, n)
                dec = GraphedDecoder(m, cache, buckets=(1, 8))
                r_graph = decode_rate(lambda t, p: dec.decode([t], [p], [0]), prompt_len, n)
                r8 = decode_rate(lambda t, p: dec.decode([t] * 8, [p] * 8, list(range(8))), prompt_len, n)
            rows.append((f"{quant:5s} bf16 eager", r_eager, nbytes, 1))
            rows.append((f"{quant:5s} bf16 CUDA graph", r_graph, nbytes, 1))
            rows.append((f"{quant:5s} bf16 CUDA graph, batch 8 (aggregate)", 8 * r8, nbytes, 8))
            del m, cache, dec
            if DEV == "cuda":
                torch.cuda.empty_cache()
            return f"{r_eager:.0f} / {r_graph:.0f} / {8 * r8:.0f} tok/s"

    @check("1B speculative (int4 self-draft of bf16 target, k adaptive) decode rate")
    def _() -> str:
        draft = make_self_draft(base, scheme="int4")
        cache = cache_for(base)
        dec = SpeculativeDecoder(base, draft, cache, draft_cache_like(draft, cache), k=4)
        ids = list(range(100, 100 + prompt_len))
        with torch.inference_mode():
            logits = base(torch.tensor([ids], device=DEV), torch.arange(prompt_len, device=DEV)[None], cache, [0])
        dec.prefill_draft(0, ids)
        out, pos = [int(logits[0, -1].argmax())], prompt_len
        sync()
        t0 = time.perf_counter()
        while len(out) < n:
            new = dec.step(0, out[-1], pos, SamplingParams())
            out, pos = out + new, pos + len(new)
        sync()
        rate = (len(out) - 1) / (time.perf_counter() - t0)
        rows.append((f"bf16 + speculative (acc {dec.stats.acceptance_rate:.2f})", rate, weight_bytes_per_token(base), 1))
        return f"{rate:.1f} tok/s, acceptance {dec.stats.acceptance_rate:.2f}"

    print(f"\n{'variant':44s} {'tok/s':>9s} {'MB/token':>9s} {'% HBM bound':>12s}")
    for name, rate, nbytes, per_step in rows:
        # Weights are read once per step whatever the batch; speculative rows count emitted tokens (an upper view).
        print(f"{name:44s} {rate:9.1f} {nbytes / 1e6:9.1f} {100 * rate / per_step * nbytes / (bw * 1e9):11.1f}%")


if __name__ == "__main__":
    main()
