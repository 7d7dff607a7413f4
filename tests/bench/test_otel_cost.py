"""bench.otel_cost in its tiny form: every case runs and accounts for every span (exported with a receiver, none
with export off, none exported and all dropped or failed with a receiver that never answers)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPANS = 50 * 9 + 1  # 50 voice turns of nine spans each, and the session


@pytest.mark.timeout(300)
def test_otel_cost_tiny() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.otel_cost", "--tiny", "--every-ms", "1"], cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["export", "turns"]
    rows = {cols[0]: cols for cols in (line.split() for line in lines[2:])}
    assert set(rows) == {"off", "receiver", "hang"} and all(r[1] == "50" for r in rows.values())
    counts = {mode: tuple(int(x) for x in r[-3:]) for mode, r in rows.items()}  # exported, dropped, failed
    assert counts["receiver"] == (SPANS, 0, 0) and counts["off"] == (0, 0, 0)
    exported, dropped, failed = counts["hang"]
    assert exported == 0 and dropped + failed == SPANS
    assert all(float(r[2]) >= 0 for r in rows.values())
