"""`parley serve` (what `make run` runs): loads the models, prints the URL, answers /healthz; a missing model
is one clear line and exit code 1."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server_config import write_test_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip


def test_serve_prints_the_url_once_models_are_loaded(tmp_path: Path) -> None:
    cfg = write_test_config(tmp_path, token=None)
    proc = _cli("--config", str(cfg), "serve", "--port", "0")
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Parley is listening on http://127.0.0.1:"):
                break
        else:
            pytest.fail(f"no URL printed: {''.join(seen)}")
        url = line.split()[-1]
        assert any("models ready" in s for s in seen)
        assert any("KV cache float16" in s for s in seen), seen  # the CPU default for the float32 model
        health = httpx.get(url + "/healthz", timeout=10).json()
        assert health["models_loaded"] is True and health["sessions"] == 0
        assert health["llm_decode"].startswith("compiled CPU step"), health  # g++ is part of the setup
        assert httpx.get(url + "/", timeout=10).status_code == 200  # the browser client
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_with_a_missing_model_says_so_and_exits_1(tmp_path: Path) -> None:
    cfg = write_test_config(tmp_path)
    proc = _cli("--config", str(cfg), "--set", "models.asr.source=/nonexistent/whisper", "serve")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "parley: asr: model path '/nonexistent/whisper' does not exist" in out
    assert "Traceback" not in out
