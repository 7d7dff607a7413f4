"""Prompt chunks and batched rows: the compiled CPU step against torch's path, in-process, on one embedded model.

For each chunk size: the same tokens prefilled into two slots of one cache, by the model's torch forward and by the
compiled step (`NativeDecoder.prefill`), best of three, with the cosine of the two last-row logits and whether their
argmax agrees. Then batched decode steps (rows in slots of their own, head included) at 1-16 rows. What
llm_engine.batch.NATIVE_PREFILL_MAX is read from.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.native_chunks [--llm embedded-0.5b] [--tiny]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def best_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, 1000 * (time.perf_counter() - t0))
    return best


def run(llm: str, sizes: list[int], rows: list[int], repeats: int) -> tuple[list[list[str]], list[list[str]], str]:
    import torch

    from llm_engine.engine import Engine
    from llm_engine.threads import on_own_thread
    from parley.locate import resolve

    path = resolve("llm", llm)
    engine = on_own_thread(lambda: Engine.from_path(path, quant="int4", max_seq_len=2048, max_slots=16))
    native = engine.stepper.native
    if native is None:
        raise SystemExit(f"no compiled step here: {engine.stepper.path}")

    def measure() -> tuple[list[list[str]], list[list[str]]]:
        gen = torch.Generator().manual_seed(0)
        chunks = []
        for n in sizes:
            tokens = torch.randint(100, 20000, (n,), generator=gen).tolist()
            with torch.inference_mode():
                eager = lambda: engine.model(torch.tensor([tokens]), torch.arange(n)[None], engine.cache, [0], "last", kv_len=n)  # noqa: E731
                ours = lambda: native.prefill(1, tokens, 0, [n - 1])  # noqa: E731
                t_eager, t_ours = best_ms(eager, repeats), best_ms(ours, repeats)
                ref, got = eager()[0, -1], ours()[0]
            cos = float(torch.nn.functional.cosine_similarity(ref, got, dim=0))
            chunks.append([str(n), f"{t_eager:.1f}", f"{t_ours:.1f}", f"{t_eager / t_ours:.2f}x", f"{cos:.5f}",
                           "yes" if int(ref.argmax()) == int(got.argmax()) else "no"])  # fmt: skip
        batched = []
        for r in rows:
            ms = best_ms(lambda: native.decode([100] * r, [5] * r, list(range(r))), repeats)
            batched.append([str(r), f"{ms:.1f}", f"{ms / r:.1f}"])
        return chunks, batched

    try:
        chunks, batched = on_own_thread(measure)
    finally:
        engine.stop()
    return chunks, batched, engine.decode_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llm", default="embedded-0.5b", help="an embedded model's name or a path (default %(default)s)")
    p.add_argument("--tiny", action="store_true", help="the 135M, two sizes, one repeat: a smoke test")
    args = p.parse_args(argv)
    from bench import _stats

    if args.tiny:
        chunks, batched, path = run("embedded-135m", [4, 20], [1, 2], 1)
    else:
        chunks, batched, path = run(args.llm, [1, 7, 12, 16, 19, 47, 137, 317], [1, 2, 4, 8, 16], 3)
    print(f"{args.llm if not args.tiny else 'embedded-135m'}: {path}")
    print(_stats.table(("chunk tokens", "torch ms", "compiled ms", "speed-up", "logits cos", "same argmax"), chunks))
    print(_stats.table(("batched rows", "step ms", "ms a row"), batched))
    return 0


if __name__ == "__main__":
    sys.exit(main())
