"""How long a full garbage collection holds the GIL in a loaded server process, before and after parley.heap freezes
what start-up loaded (the stall a turn meets when one runs mid-reply).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.gc_pause [--rounds 5] [--tiny]
--tiny: a synthetic heap of 250,000 small objects instead of the models (no model files, a few seconds).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

from parley import heap


def _full_collection_ms(rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        gc.collect(2)
        out.append(1000.0 * (time.perf_counter() - t0))
    return out


def measure(rounds: int, tiny: bool) -> dict[str, Any]:
    keep: Any
    if tiny:
        keep = [[i, [i]] for i in range(125_000)]  # two tracked lists each
    else:
        from parley import runtime as rt
        from parley.config import load_config

        keep = rt.load_and_warm(load_config())
    tracked = len(gc.get_objects())
    before = _full_collection_ms(rounds)
    frozen = heap.freeze_loaded()
    after = _full_collection_ms(rounds)
    gc.unfreeze()  # leave the process as it was (a test may run this)
    del keep
    return {"tracked": tracked, "frozen": frozen, "before_ms": before, "after_ms": after}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a synthetic heap, no models")
    args = p.parse_args(argv)
    r = measure(args.rounds, args.tiny)
    print(f"objects tracked {r['tracked']:,}, frozen {r['frozen']:,} ({'synthetic' if args.tiny else 'models loaded'})")
    print("heap             full collection ms (median, max)")
    for name, key in (("as loaded", "before_ms"), ("frozen", "after_ms")):
        print(f"{name:<16} {statistics.median(r[key]):.1f}, {max(r[key]):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
