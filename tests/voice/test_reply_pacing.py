"""A reply's later phrases are synthesised only as far ahead of the client's playback as the lead allows: the
client's marks say where playback is, so a client that stops marking (or playing) does not get the whole reply
synthesised ahead, however much time passes; its next mark lets the reply go on. On a scripted clock."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from fakes import FakeTts
from voice.outbox import Outbox
from voice.reply import MARK_CARRY_S, Reply, VoiceBinding, WorkCounter

pytestmark = pytest.mark.timeout(60)
SENTENCE = "One two three four five."  # a phrase of 500 ms at 100 ms a word
PHRASES = 12


class Clock:
    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


async def _until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):
        while not cond():
            await asyncio.sleep(0.002)


async def _deltas() -> AsyncIterator[str]:
    for _ in range(PHRASES):
        yield SENTENCE + " "


async def _drain(outbox: Outbox) -> None:
    while True:
        item = await outbox.get()
        if getattr(item, "on_sent", None) is not None:
            item.on_sent()


async def test_a_client_that_stops_marking_does_not_get_the_whole_reply_synthesised_ahead() -> None:
    clock, tts, outbox = Clock(), FakeTts(ms_per_word=100.0), Outbox()
    reply = Reply(1, outbox, VoiceBinding(tts), 1.0, 16000, None, WorkCounter(), audio_lead_ms=500.0, clock=clock)
    drainer = asyncio.create_task(_drain(outbox))
    task = asyncio.create_task(reply.run(_deltas()))
    try:
        await _until(lambda: reply.sent_ms > 0)
        reply.mark_played(100.0)  # the client plays ...
        clock.s += 1000.0  # ... then stops marking; a long time passes (the clock alone would let it all through)
        allowed_ms = 100.0 + 1000.0 * MARK_CARRY_S + reply.audio_lead_ms  # its last mark, carried on, plus the lead
        await _until(lambda: reply.waiting_for_playback and reply.queued_ms > allowed_ms)
        assert reply.queued_ms <= allowed_ms + 100.0  # one 100 ms piece past it at most
        assert len(tts.calls) <= allowed_ms // 500 + 2 < PHRASES  # the phrase being sent, and none after it
        made = len(tts.calls)
        reply.mark_played(3000.0)  # a later mark: the reply goes on, as far as that allows
        clock.s += 0.25
        await _until(lambda: reply.waiting_for_playback and reply.queued_ms > 3000.0 + 250.0 + 500.0)
        assert reply.queued_ms <= 3000.0 + 250.0 + 500.0 + 100.0
        assert made < len(tts.calls) < PHRASES
        assert not task.done()
    finally:
        task.cancel()  # the user stops listening: synthesis stops with it
        await asyncio.gather(task, return_exceptions=True)
        drainer.cancel()
    # the worker thread sees the stop at its next chunk (voice.tts_stream), a moment after the cancel returns
    await _until(lambda: tts.active == 0)
    assert len(tts.calls) < PHRASES


async def test_without_marks_of_progress_the_reply_is_paced_by_the_clock_from_its_first_audio() -> None:
    clock, tts, outbox = Clock(), FakeTts(ms_per_word=100.0), Outbox()
    reply = Reply(1, outbox, VoiceBinding(tts), 1.0, 16000, None, WorkCounter(), audio_lead_ms=500.0, clock=clock)
    drainer = asyncio.create_task(_drain(outbox))
    task = asyncio.create_task(reply.run(_deltas()))
    await _until(lambda: reply.waiting_for_playback)
    assert reply.queued_ms <= 600.0  # the lead (plus a piece) past the clock's playback, which has not moved
    reply.mark_played(0.0)  # "playback started" alone, as many clients send: still the clock
    clock.s += 60.0
    await asyncio.wait_for(task, 20)  # a minute of playback by the clock: the whole reply may go out
    drainer.cancel()
    assert len(tts.calls) == PHRASES and reply.queued_ms == pytest.approx(PHRASES * 500.0)
