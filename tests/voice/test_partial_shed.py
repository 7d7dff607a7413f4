"""Partials are optional work: while the machine cannot spare them they run every `partial_busy_interval_ms` of new
audio instead of every `partial_interval_ms`, and the turn's trace counts each one held back (voice.listener)."""
from __future__ import annotations

from tests.fakes import FakeTranscriber, FakeVad, tone
from voice.listener import Listener
from voice.trace import TurnTrace

FRAME_MS = 32


def _listener(busy: list[str | None], busy_interval_ms: int) -> Listener:
    return Listener(
        "s", FakeVad, FakeTranscriber(), llm=None, turn_model=None,  # type: ignore[arg-type]
        partial_interval_ms=500, min_speech_ms=200, partial_busy_interval_ms=busy_interval_ms, busy=lambda: busy[0],
    )  # fmt: skip


async def _due_at_ms(listener: Listener, frames: int) -> list[int]:
    """Feed `frames` frames of speech; -> the audio times (ms) at which a partial was due. Each due partial is
    decoded there and then (the listener's own partial(), on the fake transcriber), as the session would."""
    utt = listener.utt
    assert utt is not None
    due = []
    for i in range(1, frames + 1):
        if listener.feed(tone(FRAME_MS)):
            due.append(i * FRAME_MS)
            await listener.partial(utt)
    return due


async def test_a_partial_is_due_every_interval_when_the_machine_can_spare_it() -> None:
    listener = _listener([None], busy_interval_ms=2000)
    listener.open(1, TurnTrace(1), 0.0)
    due = await _due_at_ms(listener, 100)  # 3.2 s of speech
    assert due == [512, 1024, 1536, 2048, 2560, 3072]
    assert "partials_shed" not in listener.utt.trace.info  # type: ignore[union-attr]


async def test_while_busy_partials_come_every_busy_interval_and_each_hold_is_counted() -> None:
    busy: list[str | None] = ["2 engine requests of other sessions"]
    listener = _listener(busy, busy_interval_ms=2000)
    utt = listener.open(1, TurnTrace(1), 0.0)
    assert await _due_at_ms(listener, 100) == [2016]  # held at 512 (counted once while it waits), run at 2 s of new audio
    assert utt.trace.info["partials_shed"] == 2  # the hold from 512 ms, and the one from 2,528 ms still waiting
    busy[0] = None  # the machine has room again: the held partial runs on the next frame
    assert listener.feed(tone(FRAME_MS))
    assert utt.trace.info["partials_shed"] == 2


async def test_zero_busy_interval_never_holds_a_partial_back() -> None:
    listener = _listener(["queued"], busy_interval_ms=0)
    utt = listener.open(1, TurnTrace(1), 0.0)
    assert await _due_at_ms(listener, 100) == [512, 1024, 1536, 2048, 2560, 3072]
    assert "partials_shed" not in utt.trace.info
