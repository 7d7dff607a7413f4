"""A real `parley serve` process over a long conversation that outgrows its context (its own server: it changes what
the process holds). Its start and its end by SIGTERM mid-reply are tests/server/test_serve.py's."""
from __future__ import annotations

from pathlib import Path

import pytest

from server_config import TOKEN
from server_process import ServerProcess
from ws_client import open_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_long_conversation_drops_old_turns_rarely_and_keeps_its_cache(tmp_path: Path) -> None:
    """Finding 8's other half against a real process: with a context of 384 tokens (history ~770 characters) a
    conversation overflows within a few turns. Dropping the oldest message every turn changed the prompt's
    prefix every turn, and every turn recomputed the whole prompt; now old turns go in halves, rarely, and
    the turns between drops compute only their new message (counted by the engine, not timed). Nobody listens:
    each reply's audio is sent as fast as it is made, not paced to real time (audio_lead_s)."""
    # the drops themselves (summaries off: when one is ready depends on the machine's pace; tests/voice/test_session_summary.py)
    more = {"models": {"llm": {"max_seq_len": 384, "summarise_history": False}}, "server": {"audio_lead_s": 600}}
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
