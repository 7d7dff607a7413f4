"""One user's backlog stays theirs: typed messages that supersede each other leave at most one warm-up prefill and
one reply queued on the real engine; the superseded ones' prefills are cancelled (counted on the engine).

The engine is never started: nothing runs until the test steps it, so what is queued is exact, not a race."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from fakes import Harness
from llm_engine.engine import Engine
from parley.locate import find_embedded

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    yield Engine.from_path(find_embedded("llm", "embedded-135m"), max_seq_len=1024, max_slots=2)


async def _until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.005)


async def test_superseded_typed_messages_cancel_their_queued_prefills(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[int] = []  # max_new_tokens of each request, in order
    real_submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda req, on_event=None: (submitted.append(req.sampling.max_new_tokens), real_submit(req, on_event))[1])

    def _queued(_: Engine) -> int:
        return len(submitted)

    # each message outgrows the history alone: every reply's end drops history and asks for a warm-up prefill
    async with Harness(engine=engine, history_chars=300, warm_prompt=True) as h:  # type: ignore[arg-type]
        await _until(lambda: _queued(engine) == 1)  # the persona's warm-up at start
        for i in range(5):
            before = _queued(engine)
            h.session.text_input(f"message {i}: " + "tell me about the sea " * 20)
            # the previous reply ends (its history drop asks for a new warm-up) and this one's request is queued
            await _until(lambda: _queued(engine) >= before + (1 if i == 0 else 2))
        assert _queued(engine) == 1 + 5 + 4  # start's warm-up, five replies, four warm-ups after a drop
        assert [n > 0 for n in submitted] == [False, True] + [False, True] * 4
        while len(h.of("response.done")) < 5:  # step (on a thread, as the engine's would) until the last reply ends
            if await asyncio.to_thread(engine.step) is None:
                await asyncio.sleep(0.01)  # held while its first phrase is synthesised, or its events are on the way
        # four superseded replies, and every warm-up but the last (the start's and three after drops), were
        # cancelled before their prompts ran; only the last warm-up and the last reply were computed
        assert engine.cancelled_prefills == 4 + 4
        done = await h.wait_for("response.done", 5)
        assert [d["interrupted"] for d in h.of("response.done")] == [True] * 4 + [False]
        assert done["usage"]["output_tokens"] > 0
