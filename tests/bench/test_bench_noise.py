"""bench.noise in its tiny mode as a subprocess (the script keeps working): every row it reports, with suppression
off and on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_noise_tiny(tmp_path: Path) -> None:
    out = tmp_path / "noise.json"
    proc = subprocess.run([sys.executable, "-m", "bench.noise", "--tiny", "--denoise", "none,rnnoise", "--out", str(out)],
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert result["prompts"] == 2 and result["words"] > 0
    for backend in ("none", "rnnoise"):
        mine = [r for r in rows if r["denoise"] == backend]
        wer = {(r["noise"], r["snr_db"]): r["wer"] for r in mine if "wer" in r}
        assert set(wer) == {("clean", None), ("music", 5), ("babble", 5), ("fan", 5)}
        assert wer[("clean", None)] <= 0.3 and all(0.0 <= w <= 2.0 for w in wer.values())
        assert {r["noise"] for r in mine if "turns_opened" in r} == {"music", "babble", "fan"}
        cost = next(r for r in mine if "delay_ms" in r)
        assert (cost["delay_ms"] > 0) == (backend != "none") and cost["cpu_per_audio_s"] >= 0
    assert "| rnnoise |" in proc.stdout
