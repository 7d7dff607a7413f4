"""A real `parley serve` process over its lifetime: a conversation that outgrows its context, and SIGTERM in the
middle of a reply. Each test starts its own server (these change what the process holds or end it)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from server_config import TOKEN
from server_process import ServerProcess
from ws_client import Client, open_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_long_conversation_drops_old_turns_rarely_and_keeps_its_cache(tmp_path: Path) -> None:
    """Finding 8's other half against a real process: with a context of 384 tokens (history ~770 characters) a
    conversation overflows within a few turns. Dropping the oldest message every turn changed the prompt's
    prefix every turn, and every turn recomputed the whole prompt; now old turns go in halves, rarely, and
    the turns between drops compute only their new message (counted by the engine, not timed). Nobody listens:
    each reply's audio is sent as fast as it is made, not paced to real time (audio_lead_s)."""
    more = {"models": {"llm": {"max_seq_len": 384}}, "server": {"audio_lead_s": 600}}
    proc = ServerProcess(tmp_path, more=more).start()
    try:
        c = await open_session(proc.ws_url(TOKEN), persona="concise")
        await c.wait_for("response.done")  # the greeting
        traces = []
        for i in range(10):
            await c.send(type="input.text", text=f"Tell me one short fact about the number {i + 1}, please.")
            done = await c.wait_for("response.done", n=i + 2)
            traces.append(await c.wait_for("turn.trace", turn_id=done["turn_id"], timeout_s=60))
        await c.__aexit__()
    finally:
        proc.stop()
    drops = [i for i, t in enumerate(traces) if t.get("context")]
    computed = [t["llm"]["prefill_tokens"] for t in traces]
    assert 1 <= len(drops) <= 5, (drops, computed)  # it overflowed, and the history went in large steps
    # a turn computes its own message (~20 tokens with the chat template); the whole prompt is 200+ tokens
    big = [i for i, n in enumerate(computed[1:], 1) if n > 60]
    assert len(big) <= len(drops), (big, drops, computed)


# -- SIGTERM during a reply ------------------------------------------------------------------------------------------


async def test_sigterm_lets_the_reply_finish_tells_the_client_and_flushes_the_trace(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path).start()
    try:
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
