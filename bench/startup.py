"""How long `parley serve` (what `make run` starts) takes to be ready: from the process's start to its "listening"
line, and the server's own account of loading each stage, over a few starts (the first may also convert the GGUF
into the user cache, once; it is reported apart).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.startup [--runs 3] [--set KEY=VALUE ...] [--markdown] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _stats
from bench._server import machine, start_server

_READY = re.compile(r"models ready in ([\d.]+) s \((.*)\)")
_STAGE = re.compile(r"(\w+) ([\d.]+) s")


def one_start(workdir: Path, i: int, sets: tuple[str, ...]) -> dict[str, Any]:
    """-> {"listening_s", "ready_s", "stages": {stage: s}} for one `parley serve`, stopped once it listens."""
    t0 = time.monotonic()
    server = start_server(workdir / f"traces{i}.jsonl", workdir / f"server{i}.log", sets=sets)
    listening_s = time.monotonic() - t0
    server.stop()
    m = _READY.search(server.log_path.read_text())
    if m is None:
        raise RuntimeError(f"no 'models ready' line in {server.log_path}")
    return {"listening_s": round(listening_s, 2), "ready_s": float(m.group(1)),
            "stages": {k: float(v) for k, v in _STAGE.findall(m.group(2))}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="starts after a first one that may convert the model (default 3)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides for the server")
    p.add_argument("--out", default="artifacts/bench/startup.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tiny", action="store_true", help="the first start alone: a smoke test")
    args = p.parse_args(argv)
    if args.tiny:
        args.runs = 0
    with tempfile.TemporaryDirectory(prefix="parley-startup-") as tmp:
        first = one_start(Path(tmp), 0, tuple(args.set))
        starts = [one_start(Path(tmp), i + 1, tuple(args.set)) for i in range(args.runs)]
    stages = list(first["stages"])
    med = lambda xs: _stats.percentile(xs, 50)  # noqa: E731
    rows = [["first start", f"{first['listening_s']:.1f}", f"{first['ready_s']:.1f}", *(f"{first['stages'][s]:.1f}" for s in stages)]]
    if starts:
        rows.append([f"median of {len(starts)} later", f"{med([r['listening_s'] for r in starts]):.1f}",
                     f"{med([r['ready_s'] for r in starts]):.1f}", *(f"{med([r['stages'][s] for r in starts]):.1f}" for s in stages)])  # fmt: skip
    table = _stats.markdown if args.markdown else _stats.table
    print("\n`parley serve` start, seconds (listening: process start to the URL; models ready and each stage: the server's own count)")
    print(table(("start", "listening s", "models ready s", *(f"{s} s" for s in stages)), rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "first": first, "starts": starts}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
