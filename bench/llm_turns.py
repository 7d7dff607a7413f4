"""Conversation turns on the embedded SmolLM2 (or --model PATH): our engine beside transformers on the same weights.

Prints load time, prefill ms for 256 prompt tokens, second-turn time to first token and decode tokens/s
through the whole Engine (threads, slots, cache reuse). transformers runs `generate`, which re-reads the
whole conversation each turn (no slot cache). The speed features and llama.cpp are in bench/llm.py.
Usage: .venv/bin/python -m bench.llm_turns [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--model PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench.llm_speed import llm_path  # noqa: E402

from llm_engine.engine import Engine  # noqa: E402
from llm_engine.gguf_loader import prepare_gguf  # noqa: E402
from llm_engine.loader import resolve_dtype  # noqa: E402
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams  # noqa: E402
from llm_engine.threads import on_own_thread  # noqa: E402

PROMPT_TOKENS = 256
DECODE_TOKENS = 64
REPEATS = 3
SYSTEM = ChatMessage("system", "You are a helpful, friendly voice assistant. Keep answers short.")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    """ms of fn() on a thread that exits (llm_engine.threads: no second OpenMP pool beside the engine's)."""

    def run() -> float:
        with torch.inference_mode():  # thread-local: set on the thread that runs
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            return 1000 * (time.perf_counter() - t0)

    return on_own_thread(run)


def long_user_message(engine: Engine, n_tokens: int) -> tuple[ChatMessage, ...]:
    """A conversation whose rendered prompt is exactly n_tokens long (filler words trimmed to fit)."""
    words = ("The quick brown fox jumps over the lazy dog near the river bank. " * 80).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the longest filler whose prompt still fits
        mid = (lo + hi + 1) // 2
        msgs = (SYSTEM, ChatMessage("user", " ".join(words[:mid])))
        lo, hi = (mid, hi) if len(engine.tokenizer.apply_chat_template(msgs)) <= n_tokens else (lo, mid - 1)
    return SYSTEM, ChatMessage("user", " ".join(words[:lo]))


def run(model_path: Path, device: str, dtype: str) -> list[tuple[str, float, float, str]]:
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    # no prefix cache: each "prefill" session below must compute its whole prompt, not copy it from the warm one
    engine = on_own_thread(lambda: Engine.from_path(model_path, device=device, dtype=dtype, max_seq_len=1024, max_slots=4,
                                                    prefix_cache=False))
    ours_load = time.perf_counter() - t0
    engine.start()
    folder = prepare_gguf(model_path) if model_path.suffix == ".gguf" else model_path

    def load_reference():
        if model_path.suffix == ".gguf":
            ref = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name, dtype=resolve_dtype(dtype))
        else:
            ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=resolve_dtype(dtype))
        return ref.to(device).eval()

    t0 = time.perf_counter()
    ref = on_own_thread(load_reference)
    ref_load = time.perf_counter() - t0

    def ask(session: str, msgs, max_new: int):
        return engine.submit(GenerateRequest(session, tuple(msgs), SamplingParams(max_new_tokens=max_new))).collect()

    # Prefill: a fresh session each time, 256 prompt tokens, prefill only.
    msgs256 = long_user_message(engine, PROMPT_TOKENS)
    ids256 = torch.tensor([engine.tokenizer.apply_chat_template(msgs256)], device=device)
    ask("warm", msgs256, 2)
    ours_prefill, ref_prefill = [], []
    for i in range(REPEATS):
        _, _, fin = ask(f"prefill{i}", msgs256, 0)
        assert fin.timings.prefill_tokens == ids256.shape[1]
        ours_prefill.append(fin.timings.prefill_ms)
        engine.release(f"prefill{i}")
        with torch.inference_mode():
            ref_prefill.append(timed(lambda: ref(ids256, use_cache=True), device))

    # Second turn: ours keeps the session's cache; generate re-reads the whole conversation.
    ours_ttft, ref_ttft = [], []
    for i in range(REPEATS):
        turn1 = [*msgs256]
        _, text1, _ = ask(f"turns{i}", turn1, 24)
        turn2 = turn1 + [ChatMessage("assistant", text1), ChatMessage("user", "Thanks. And what about cats?")]
        _, _, fin = ask(f"turns{i}", turn2, 1)
        ours_ttft.append(fin.timings.first_token_ms)
        engine.release(f"turns{i}")
        ids2 = torch.tensor([engine.tokenizer.apply_chat_template(turn2)], device=device)
        with torch.inference_mode():
            ref_ttft.append(timed(lambda: ref.generate(ids2, max_new_tokens=1, do_sample=False), device))

    # Decode: stop tokens off so both run the full length.
    stop_ids = engine.tokenizer.stop_ids
    engine.tokenizer.stop_ids = frozenset()
    short = (SYSTEM, ChatMessage("user", "Tell me a long story about a lighthouse keeper."))
    ids_short = torch.tensor([engine.tokenizer.apply_chat_template(short)], device=device)
    ours_tps, ref_tps = [], []
    for i in range(REPEATS):
        _, _, fin = ask(f"decode{i}", short, DECODE_TOKENS + 1)
        ours_tps.append(fin.timings.decode_tokens_per_s)
        engine.release(f"decode{i}")
        with torch.inference_mode():
            kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
            one = timed(lambda: ref.generate(ids_short, max_new_tokens=1, min_new_tokens=1, **kw), device)
            full = timed(lambda: ref.generate(ids_short, max_new_tokens=DECODE_TOKENS + 1, min_new_tokens=DECODE_TOKENS + 1, **kw), device)
        ref_tps.append(1000 * DECODE_TOKENS / (full - one))
    engine.tokenizer.stop_ids = stop_ids
    engine.stop()

    med = statistics.median
    return [
        ("load (s)", ours_load, ref_load, "lower"),
        (f"prefill {PROMPT_TOKENS} tokens (ms)", med(ours_prefill), med(ref_prefill), "lower"),
        ("turn-2 time to first token (ms)", med(ours_ttft), med(ref_ttft), "lower"),
        ("decode (tokens/s)", med(ours_tps), med(ref_tps), "higher"),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a .gguf or HF folder (default: the embedded SmolLM2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    path = llm_path(args.model)
    rows = run(path, args.device, args.dtype)
    print(f"\nLLM engine vs transformers generate: {path.name}, {args.device} {args.dtype}, {torch.get_num_threads()} threads")
    print(f"{'metric':<34}{'ours':>10}{'transformers':>14}{'ours better by':>16}")
    for name, ours, ref, better in rows:
        ratio = ref / ours if better == "lower" else ours / ref
        print(f"{name:<34}{ours:>10.1f}{ref:>14.1f}{ratio:>15.2f}x")


if __name__ == "__main__":
    main()
