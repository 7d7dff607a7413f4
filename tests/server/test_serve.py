"""`parley serve` (what `make run` runs): loads the models, prints the URL, answers /healthz; a missing model
is one clear line and exit code 1."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from server_process import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_serve_prints_the_url_once_models_are_loaded(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, token=None).start()  # returns once it printed "Parley is listening on <url>"
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert any("models ready" in s for s in server.lines)
        assert any("KV cache float16" in s for s in server.lines), server.lines  # the CPU default for the float32 model
        health = httpx.get(server.url + "/healthz", timeout=10).json()
        assert health["models_loaded"] is True and health["sessions"] == 0
        assert health["llm_decode"].startswith("compiled CPU step"), health  # g++ is part of the setup
        assert httpx.get(server.url + "/", timeout=10).status_code == 200  # the browser client
        metrics = httpx.get(server.url + "/metrics", timeout=10).text  # what loading made is out of later collections
        frozen = next(line for line in metrics.splitlines() if line.startswith("parley_gc_frozen_objects "))
        assert float(frozen.split()[1]) > 100_000, frozen
        assert "parley_gc_full_pause_seconds_total " in metrics
    finally:
        server.stop()


def test_serve_with_a_missing_model_says_so_and_exits_1(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, more={"models": {"asr": {"source": "/nonexistent/whisper"}}})
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start(timeout_s=120)
    out = "".join(server.lines)
    assert server.proc is not None and server.proc.returncode == 1, out
    assert "parley: asr: model path '/nonexistent/whisper' does not exist" in out
    assert "Traceback" not in out
