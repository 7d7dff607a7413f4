"""bench/llm.py's KV-cache table: decode speed and memory per slot with float16 vs int8 keys and values.

The default path (int4, the compiled step) at a fixed position with this many cached positions behind it;
memory is what one slot of that length holds (int8: codes plus a float32 scale per head and position).
"""
from __future__ import annotations

from pathlib import Path

import torch

from bench.llm_speed import native_rate_at
from llm_engine.fuse import fuse_projections
from llm_engine.gguf_quant import read_quantized_linears
from llm_engine.kv_cache import StaticKVCache
from llm_engine.loader import load_model
from llm_engine.quantize import quantize_model

KV_TYPES = (("float16", torch.float16), ("int8", torch.int8))


def slot_mb(cfg, positions: int, dtype: torch.dtype) -> float:
    """MB one slot of `positions` positions holds (both keys and values, scales included)."""
    return StaticKVCache(cfg.num_layers, 1, cfg.num_kv_heads, positions, cfg.head_dim, dtype=dtype, device="meta").nbytes / 1e6


def kv_table(path: Path, positions: list[int], steps: int = 32, rounds: int = 3) -> dict[str, list[float]]:
    """Prints the table; -> tokens/s per KV type, one per position count."""
    model, _ = load_model(path, max_seq_len=max(positions) + 1)
    gguf = read_quantized_linears(path, "int4") if path.suffix == ".gguf" else {}
    model = fuse_projections(quantize_model(model, "int4", replacements=gguf))
    print(f"\nKV cache element type: one request, int4, compiled step, decode tokens/s at a fixed position (best of"
          f" {rounds} rounds alternating the two, each the best of three {steps}-step runs) and MB one slot holds at that length")
    print(f"{'':34s}" + "".join(f"{f'{p} tok/s':>14s}{f'{p} MB/slot':>14s}" for p in positions))
    rates: dict[str, list[float]] = {name: [0.0] * len(positions) for name, _ in KV_TYPES}
    for _ in range(rounds):  # alternating, best of each: on a shared machine both see the same disturbances
        for name, dtype in KV_TYPES:
            rates[name] = [max(a, b) for a, b in zip(rates[name], native_rate_at(model, positions, dtype, steps))]
    for name, dtype in KV_TYPES:
        cells = "".join(f"{r:14.1f}{slot_mb(model.cfg, p, dtype):14.2f}" for r, p in zip(rates[name], positions))
        print(f"{'ours, ' + name + ' KV cache':34s}{cells}", flush=True)
    ratio = "".join(f"{i / f:13.2f}x{slot_mb(model.cfg, p, torch.int8) / slot_mb(model.cfg, p, torch.float16):13.2f}x"
                    for i, f, p in zip(rates["int8"], rates["float16"], positions))  # fmt: skip
    print(f"{'int8 / float16':34s}{ratio}")
    return rates


def main() -> None:
    import argparse

    from parley.locate import find_embedded

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded", help="a .gguf, or an embedded name: embedded-0.5b, embedded-1.5b, ...")
    p.add_argument("--positions", default="256,2000", help="cached positions, comma-separated (default 256,2000)")
    args = p.parse_args()
    path = Path(args.model) if args.model.endswith(".gguf") else find_embedded("llm", args.model)
    kv_table(path, [int(x) for x in args.positions.split(",")])


if __name__ == "__main__":
    main()
