"""Barge-in on fakes: speech during a reply cancels it (engine, TTS, queued audio) and history keeps what was
heard; a short burst or a backchannel does not interrupt; closing mid-reply leaves nothing running."""
from __future__ import annotations

import asyncio

import pytest

from fakes import FakeEngine, FakeTts, Harness, quiet, tone
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

LONG_REPLY = ("One two three four five six. " * 8).split()


def long_engine() -> FakeEngine:
    return FakeEngine(reply_words=LONG_REPLY, token_s=0.02)


async def _until_reply_audio(h: Harness) -> int:
    h.session.text_input("tell me a long story")
    first = await h.wait_for("audio")
    return first["turn_id"]


async def test_speech_during_reply_clears_audio_cancels_everything_and_keeps_what_was_heard() -> None:
    async with Harness(engine=long_engine(), tts=FakeTts(ms_per_word=150.0)) as h:
        turn = await _until_reply_audio(h)
        h.session.playback_mark(turn, 1000.0, 0)  # the client has played 1 s: 6 words of 150 ms
        cleared = lambda: bool(h.of("response.audio.clear"))  # noqa: E731
        start_ms = h.audio_ms
        at_ms = await h.feed(tone(800), until=cleared)
        assert at_ms is not None, "no response.audio.clear"
        # the clear is decided on the frame where the speech has lasted barge_in_min_speech_ms (200), on the audio
        # clock; when it reaches the test (how much more audio was fed meanwhile) is the machine's speed
        assert h.settings.turns.barge_in_min_speech_ms == 200.0
        assert at_ms - start_ms >= 200.0
        assert h.of("response.audio.clear")[0]["t_ms"] == start_ms + 200.0  # the frame that decided it
        done = await h.wait_for("response.done")
        assert h.of("response.audio.clear")[0]["turn_id"] == turn == done["turn_id"]
        assert done["interrupted"]
        assert done["spoken_text"] == "One two three four five six."
        assert h.session.history[-1] == ("assistant", "One two three four five six.")
        # nothing of the cancelled turn is sent after the clear
        clear_at = h.messages.index(h.of("response.audio.clear")[0])
        assert not [m for m in h.messages[clear_at:] if m["type"] == "audio" and m["turn_id"] == turn]
        await wait_for(lambda: h.engine.cancelled == 1 and h.tts.active == 0 and h.stages.tts_work.active == 0,
                       what="the reply's engine request and synthesis to stop")
        assert h.engine.finished[-1].reason == "cancelled"
        assert len(h.engine.finished[-1:]) == 1 and h.engine.finished[-1].timings.decode_tokens < len(LONG_REPLY)
        # the interrupting speech becomes the next turn
        await h.feed(quiet(700))
        trace = await h.wait_for("turn.trace", 2)
        assert trace["turn_id"] == turn + 1 and "voice_to_voice" in trace["stages_ms"]
        assert h.of("transcript.final")[-1]["turn_id"] == turn + 1


async def test_without_playback_marks_history_keeps_the_audio_sent() -> None:
    async with Harness(engine=long_engine(), tts=FakeTts(ms_per_word=150.0), audio_lead_ms=600.0) as h:
        await _until_reply_audio(h)
        await asyncio.sleep(0.3)
        h.session.cancel_reply()
        done = await h.wait_for("response.done")
        sent_ms = sum(m["ms"] for m in h.of("audio"))
        words = int(sent_ms // 150.0)
        assert done["interrupted"] and 0 < words < len(LONG_REPLY)
        assert done["spoken_text"].split() == LONG_REPLY[:words]
        assert h.session.history[-1] == ("assistant", done["spoken_text"])
        # a mark that arrives after the clear corrects the history to what was really played
        h.session.playback_mark(done["turn_id"], 300.0, 0)
        assert h.session.history[-1] == ("assistant", "One two")


async def test_short_burst_and_backchannel_do_not_interrupt() -> None:
    async with Harness(engine=FakeEngine(reply_words=LONG_REPLY[:18], token_s=0.01)) as h:
        await _until_reply_audio(h)
        await h.feed(tone(150))  # a 150 ms burst: starts speech (>=120 ms) but is under the 200 ms barge-in minimum
        await h.feed(quiet(700))
        await h.feed(tone(160))  # "uh-huh" (the 20 ms VAD frames it touches add up to under 200 ms)
        await h.feed(quiet(700))
        done = await h.wait_for("response.done")
        assert not done["interrupted"] and not h.of("response.audio.clear")
        assert len(h.of("vad.speech_started")) == 2 and not h.of("transcript.final")
        assert h.session.history == [("user", "tell me a long story"), ("assistant", done["text"])]


async def test_typed_turn_during_a_reply_replaces_it() -> None:
    async with Harness(engine=long_engine()) as h:
        first = await _until_reply_audio(h)
        h.session.text_input("stop, tell me something else")
        second = await h.wait_for("response.done", 2)
        done_first = h.of("response.done")[0]
        assert done_first["turn_id"] == first and done_first["interrupted"]
        assert second["turn_id"] == first + 1 and not second["interrupted"]
        assert [m["turn_id"] for m in h.of("response.audio.clear")] == [first]
        roles = [role for role, _ in h.session.history]
        assert roles == ["user", "assistant", "user", "assistant"]


async def test_closing_mid_reply_leaves_no_task_slot_or_tts_work() -> None:
    h = Harness(engine=long_engine(), tts=FakeTts(ms_per_word=150.0, delay_s=0.01))
    async with h:
        await _until_reply_audio(h)
        assert h.engine.active_slots() == 1
    await wait_for(lambda: h.engine.active_slots() == 0 and h.tts.active == 0 and h.stages.tts_work.active == 0,
                   what="the session's slot and synthesis to be freed")
    assert h.engine.cancelled == 1
    leftover = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").startswith(("Session.", "Replies.", "Reply."))]
    assert leftover == []


async def test_persona_switch_greets_in_the_new_voice() -> None:
    async with Harness(greet=True) as h:
        first = await h.wait_for("response.done")
        assert first["text"] == "Hello there."
        h.session.update(persona="storyteller")
        done = await h.wait_for("response.done", 2)
        assert done["text"] == "Hello there, traveller." and not done["interrupted"]
        assert done["turn_id"] == first["turn_id"] + 1
        assert " ".join(text for text, _, _ in h.kal.calls) == "Hello there, traveller."  # the storyteller's own voice
        assert {(rate, voice) for _, rate, voice in h.kal.calls} == {(1.0, "kal")} and len(h.tts.calls) == 1
        assert [m["turn_id"] for m in h.of("audio")][-1] == done["turn_id"]
        assert h.session.history == [("assistant", "Hello there."), ("assistant", "Hello there, traveller.")]
        assert not h.engine.requests and not h.of("turn.trace") and not h.of("response.audio.clear")
        # a voice change alone, or a persona without a greeting, says nothing
        h.session.update(voice="joe")
        h.session.update(persona="concise")
        assert h.session.state == "idle"  # a greeting would have started a reply within update()
        assert len(h.of("response.done")) == 2


async def test_persona_switch_during_a_reply_ends_it_like_a_barge_in_then_greets() -> None:
    async with Harness(engine=long_engine(), greet=True) as h:
        await h.wait_for("response.done")
        turn = h.session.text_input("tell me a long story")
        await h.wait_for("audio", len(h.of("audio")) + 1)
        h.session.update(persona="storyteller")
        greeting = await h.wait_for("response.done", 3)
        cut = h.of("response.done")[1]
        assert cut["turn_id"] == turn and cut["interrupted"]
        assert [m["turn_id"] for m in h.of("response.audio.clear")] == [turn]
        assert greeting["turn_id"] == turn + 1 and greeting["text"] == "Hello there, traveller."
        clear_at = h.messages.index(h.of("response.audio.clear")[0])
        assert not [m for m in h.messages[clear_at:] if m["type"] == "audio" and m["turn_id"] == turn]
        assert h.session.history[-1] == ("assistant", "Hello there, traveller.")
        await wait_for(lambda: h.engine.cancelled == 1, what="the cut reply's engine request to be cancelled")
