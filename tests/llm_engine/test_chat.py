"""`parley chat` loop on the real engine: streamed reply, stats line, history kept so turn two reuses the cache."""
from __future__ import annotations

import io

import pytest

from parley.chat import run_chat

pytestmark = pytest.mark.slow


def test_chat_streams_replies_and_reuses_the_cache(smol_engine):
    lines = iter(["What is the capital of France?", "Thanks!", "/quit"])
    out = io.StringIO()
    before = smol_engine.active_slots()
    run_chat(smol_engine, "You are a helpful assistant.", "Hello there!", max_new_tokens=24, read_line=lambda _: next(lines), out=out)
    text = out.getvalue()
    assert text.startswith("assistant> Hello there!")
    assert "Paris" in text
    stats = [ln for ln in text.splitlines() if "first token" in ln]
    assert len(stats) == 2 and "tok/s" in stats[0]
    assert " 0 cached" in stats[0] and " 0 cached" not in stats[1]  # turn two reused turn one's cache
    assert smol_engine.active_slots() == before  # the chat's session slot was released at the end
