"""Barge-in on fakes: speech during a reply cancels it (engine, TTS, queued audio) and history keeps what was
heard; a short burst or a backchannel does not interrupt; closing mid-reply leaves nothing running."""
from __future__ import annotations

import asyncio
import time

import pytest

from fakes import FakeEngine, FakeTranscriber, FakeTts, Harness, quiet, tone
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
        # the fake recogniser hears words in the first recognition of the interjection, asked as the speech opens
        # (min_speech_ms, 120): the clear is decided at that frame
        assert h.settings.turns.interrupt_by == "words" and h.settings.turns.min_speech_ms == 120.0
        assert h.of("vad.speech_started")[-1]["holds"] == turn  # the client paused playback at once
        assert h.of("response.audio.clear")[0]["t_ms"] == start_ms + 120.0
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
    transcriber = FakeTranscriber(by_length=[(0.0, ""), (350.0, "Uh-huh.")])  # no words in a burst; a backchannel
    async with Harness(engine=FakeEngine(reply_words=LONG_REPLY[:18], token_s=0.01), transcriber=transcriber) as h:
        turn = await _until_reply_audio(h)
        await h.feed(tone(150))  # a 150 ms burst: starts speech (>=120 ms), holds the reply, says nothing
        await h.feed(quiet(700))
        await h.feed(tone(300))  # "uh-huh"
        await h.feed(quiet(700))
        done = await h.wait_for("response.done")
        assert not done["interrupted"] and not h.of("response.audio.clear")
        assert len(h.of("vad.speech_started")) == 2 and not h.of("transcript.final")
        resumed = h.of("response.resumed")
        assert [(m["turn_id"], m["reason"]) for m in resumed] == [(turn, "none"), (turn, "backchannel")]
        assert list(h.session.history) == [("user", "tell me a long story"), ("assistant", done["text"])]


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
        assert list(h.session.history) == [("assistant", "Hello there."), ("assistant", "Hello there, traveller.")]
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


async def test_a_persona_in_another_language_decides_interruptions_by_its_own_words(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from dataclasses import replace

    import fakes
    from parley.config import DEFAULT_CONFIG, load_config, load_persona
    from parley.runtime import personas
    from voice.interjection import Heard, Kind, Lexicon, classify

    cfg = load_config()
    file = tmp_path / "german.yaml"
    file.write_text((DEFAULT_CONFIG.parent / "personas" / "assistant.yaml").read_text()
                    + '\nbackchannels: ["ja", "genau"]\nstop_words: ["halt"]\n')
    built = personas(cfg.model_copy(update={"persona_defs": {**cfg.persona_defs, "german": load_persona(file, cfg.voices)}}))
    assert built["german"].lexicon == Lexicon.of(["ja", "genau"], ["halt"]) and built["assistant"].lexicon is None
    monkeypatch.setitem(fakes.PERSONAS, "german", replace(fakes.PERSONAS["assistant"], name="german", lexicon=built["german"].lexicon))
    async with Harness(persona="german") as h:
        heard = lambda text: classify(Heard(text, -0.2, 400.0), [], h.session.turns.policy.lexicon, final=True).kind  # noqa: E731
        assert (heard("Ja."), heard("Halt!"), heard("Yeah.")) == (Kind.BACKCHANNEL, Kind.STOP, Kind.INTERRUPT)
        h.session.update(persona="assistant")  # the default words again
        assert (heard("Ja."), heard("Yeah.")) == (Kind.INTERRUPT, Kind.BACKCHANNEL)


async def test_speech_right_after_a_reply_has_played_to_its_end_clears_nothing() -> None:
    """Its marks say the whole reply played; speech in its echo tail (ECHO_TAIL_MS) is still heard as over it, and a
    request there is a new turn: nothing is left to clear, and the reply was not interrupted."""
    async with Harness(engine=FakeEngine(reply_words="It is noon.".split(), token_s=0.0), transcriber=FakeTranscriber("what time is it in Paris")) as h:
        h.session.text_input("what time is it")
        done = await h.wait_for("response.done")
        await h.feed(quiet(100))
        sent_ms = sum(m["ms"] for m in h.of("audio") if m["turn_id"] == done["turn_id"])
        h.session.playback_mark(done["turn_id"], sent_ms, time.perf_counter_ns())  # played to its end, just now
        assert h.session.turns._playing() == done["turn_id"]  # the echo tail: speech now is over the reply
        await h.feed(tone(600))
        await h.feed(quiet(1200), until=lambda: len(h.of("response.done")) == 2)
        second = await h.wait_for("response.done", 2)
        assert second["turn_id"] == done["turn_id"] + 1 and not h.of("response.audio.clear")
        assert h.session.history[-2] == ("user", "what time is it in Paris") and ("assistant", "It is noon.") in h.session.history
