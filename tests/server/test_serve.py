"""`parley serve` (what `make run` runs) over one process's life: it loads the models, prints the URL, answers
/healthz and serves the page; SIGTERM in the middle of a reply lets the reply finish, tells the clients and flushes the
trace. A missing model is one clear line and exit code 1."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from server_config import TOKEN
from server_process import ServerProcess
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_serve_prints_the_url_once_models_are_loaded_and_sigterm_lets_the_reply_finish(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path).start()  # returns once it printed "Parley is listening on <url>"
    try:
        assert proc.url.startswith("http://127.0.0.1:")
        assert any("models ready" in s for s in proc.lines)
        assert any("KV cache float16" in s for s in proc.lines), proc.lines  # the CPU default for the float32 model
        health = httpx.get(proc.url + "/healthz", timeout=10).json()  # (open without the token)
        assert health["models_loaded"] is True and health["sessions"] == 0
        assert health["llm_decode"].startswith("compiled CPU step"), health  # g++ is part of the setup
        assert httpx.get(proc.url + f"/?token={TOKEN}", timeout=10).status_code == 200  # the browser client
        metrics = httpx.get(proc.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).text
        frozen = next(line for line in metrics.splitlines() if line.startswith("parley_gc_frozen_objects "))
        assert float(frozen.split()[1]) > 100_000, frozen  # what loading made is out of later collections
        assert "parley_gc_full_pause_seconds_total " in metrics

        # SIGTERM during a reply
        realtime_url = f"ws://127.0.0.1:{proc.port}/v1/realtime"
        async with Client(proc.ws_url(TOKEN)) as c, connect(realtime_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as rt:
            assert json.loads(await rt.recv())["type"] == "session.created"
            await c.start(persona="concise")
            await c.wait_for("response.done")
            await c.send(type="input.text", text="Tell me about the moon.")
            first = await c.wait_for("audio", turn_id=2)
            code = await asyncio.to_thread(proc.terminate)
            done = await c.wait_for("response.done", 2)
            err = await c.wait_for("error")
            assert await c.wait_closed() == 1001
            rt_events = [json.loads(m) async for m in rt]  # a Realtime session is told and closed the same way
            assert rt_events[-1]["error"]["code"] == "server_shutdown" and rt.close_code == 1001
        assert code == 0
        assert not done["interrupted"] and done["turn_id"] == first["turn_id"]
        assert (err["code"], err["fatal"]) == ("server_shutdown", True)
        assert c.messages.index(err) > c.messages.index(done)
        lines = [json.loads(line) for line in proc.trace_log.read_text().splitlines()]
        assert any(t["turn_id"] == done["turn_id"] and "done" in t["marks_ms"] for t in lines)
    finally:
        proc.stop()


def test_serve_with_a_missing_model_says_so_and_exits_1(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, more={"models": {"asr": {"source": "/nonexistent/whisper"}}})
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start(timeout_s=120)
    out = "".join(server.lines)
    assert server.proc is not None and server.proc.returncode == 1, out
    assert "parley: asr: model path '/nonexistent/whisper' does not exist" in out
    assert "Traceback" not in out
