"""bench.client_playback --tiny as a subprocess (the bench tests' shared real server, headless Chromium, the desktop
client on a fake sound card): every reply's own playback start is measured in both clients and reaches the server's
traces.
Shapes and counts only: the numbers themselves are the benchmark's to print."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.parley_process import ParleyProcess

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_client_playback_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    """Against the bench tests' shared server (the shipped config, as the script would start)."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    pytest.importorskip("playwright.sync_api")
    out = tmp_path / "client_playback.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.client_playback", "--tiny", "--server", real_server.url, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "median ms" in proc.stdout and "underruns" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["clients"]) == {"browser", "desktop"} and result["turns"] == 2
    for name, client in result["clients"].items():
        replies, summary = client["replies"], client["summary"]
        assert len(replies) == 3, (name, replies)  # the greeting and two typed turns, each measured once
        assert len({r["turn_id"] for r in replies}) == 3
        for r in replies:
            assert math.isfinite(r["start_ms"]) and r["start_ms"] >= 0 and r["output_latency_ms"] >= 0, (name, r)
            assert isinstance(r["underruns"], int) and r["underruns"] >= 0
            assert name == "desktop" or r["clock"] in ("output-timestamp", "estimate")
        assert summary["replies"] == 3 and summary["first_ms"] == min(replies, key=lambda r: r["turn_id"])["start_ms"]
        assert summary["n"] == 2 and summary["median_ms"] <= summary["p95_ms"] <= summary["max_ms"]  # after the first
        assert summary["underruns"] == sum(r["underruns"] for r in replies)
        # the typed turns' traces (a greeting has none) carry what the client sent on its first playback.mark
        assert 1 <= summary["in_server_trace"] <= 2, (name, summary)
    assert result["clients"]["desktop"]["summary"]["output_latency_ms"] == 0.0  # the fake sound card reports none
