"""Session orchestration on fakes: scripted timelines (speech at t, reply of n words) -> events, states, marks."""
from __future__ import annotations

import asyncio
import gc
import time
import warnings

import numpy as np

import pytest

from fakes import PERSONAS, FakeEngine, FakeTranscriber, Harness, quiet, tone
from voice.session import InputError
from voice.trace import MARKS

pytestmark = pytest.mark.timeout(60)

VOICE_MARKS = [m for m in MARKS if m not in ("playback_start", "interrupted", "tool_start", "tool_done")]
UNPACED = 60_000.0  # audio_lead_ms for tests that count turns: replies sent as made, not paced to playback


async def test_spoken_turn_sends_events_in_order_with_a_complete_trace() -> None:
    async with Harness() as h:
        await h.feed(quiet(200) + 0)
        await h.feed(tone(600))
        await h.feed(quiet(800))
        trace = await h.wait_for("turn.trace")

        assert h.types()[:5] == ["vad.speech_started", "vad.speech_ended", "transcript.final", "response.text.delta", "audio"] or \
            h.types()[:6] == ["vad.speech_started", "transcript.partial", "vad.speech_ended", "transcript.final", "response.text.delta", "audio"]
        assert h.types()[-2:] == ["response.done", "turn.trace"]
        assert h.of("vad.speech_started")[0]["t_ms"] == 200.0
        assert h.of("vad.speech_ended")[0]["t_ms"] == 800.0
        assert h.of("transcript.final")[0]["text"] == "what is the weather like today"
        done = h.of("response.done")[0]
        assert done["text"] == "".join(d["text"] for d in h.of("response.text.delta"))
        assert done["text"] == " ".join(h.engine.reply_words) and not done["interrupted"]
        assert done["spoken_text"] == done["text"]
        # every mark of a spoken turn, in causal order
        marks = trace["marks_ms"]
        assert list(marks) == VOICE_MARKS
        order = ["speech_start", "speech_end", "endpoint", "llm_start", "llm_first_token", "first_phrase",
                 "tts_first_audio", "first_audio_sent", "done"]  # fmt: skip
        assert [marks[m] for m in order] == sorted(marks[m] for m in order)
        stages = trace["stages_ms"]
        assert stages["voice_to_voice"] == pytest.approx(marks["first_audio_sent"] - marks["speech_end"], abs=0.01)
        assert set(stages) == {"endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"}
        assert trace["budgets_ms"] == {"voice_to_voice": 1800.0, "asr": 300.0}
        assert list(h.session.history) == [("user", "what is the weather like today"), ("assistant", done["text"])]
        assert h.session.state == "idle"
        assert h.traces[0].turn_id == trace["turn_id"] == done["turn_id"]


async def test_speech_end_is_the_arrival_of_the_message_holding_the_last_voiced_sample() -> None:
    async with Harness() as h:
        t0 = time.perf_counter_ns() - 5_000_000_000  # a client clock 5 s in the past, 1 ms of arrival per ms of audio
        audio = tone(600).tolist() + quiet(700).tolist()
        import numpy as np

        samples = np.asarray(audio, dtype=np.float32)
        for i in range(0, len(samples), 320):
            h.session.push_audio(samples[i : i + 320], t0 + (i // 16) * 1_000_000)
            await asyncio.sleep(0)
        trace = await h.wait_for("turn.trace")
        # the last voiced sample (599.9 ms) came in the message that started at 580 ms audio time
        assert trace["marks_ms"]["speech_end"] - trace["marks_ms"]["speech_start"] == pytest.approx(580.0)


async def test_reply_is_capped_at_the_personas_max_reply_tokens_and_switching_persona_changes_prompt_and_voice() -> None:
    async with Harness() as h:
        h.session.update(persona="concise")
        assert (h.session.persona_name, h.session.voice_name) == ("concise", "kal")
        h.session.text_input("hello")
        await h.wait_for("response.done")
        req = h.engine.requests[-1]
        assert req.sampling.max_new_tokens == PERSONAS["concise"].max_reply_tokens == 3
        assert req.messages[0].content == "Be brief."
        assert h.of("response.done")[0]["text"] == " ".join(h.engine.reply_words[:3])
        assert h.kal.calls and h.kal.calls[0][1:] == (1.25, "kal") and not h.tts.calls
        # a typed turn has no speech marks but the LLM and TTS ones
        trace = await h.wait_for("turn.trace")
        assert "speech_end" not in trace["marks_ms"] and "voice_to_voice" not in trace["stages_ms"]
        assert trace["persona"] == "concise" and trace["input"] == "text"
        with pytest.raises(InputError) as err:
            h.session.update(persona="pirate")
        assert err.value.code == "unknown_persona"
        h.session.update(voice="joe")
        assert (h.session.persona_name, h.session.voice_name) == ("concise", "joe")


async def test_greeting_is_spoken_first_and_enters_history_without_a_trace() -> None:
    async with Harness(greet=True) as h:
        done = await h.wait_for("response.done")
        assert done["text"] == "Hello there." and not done["interrupted"]
        assert h.types() == ["response.text.delta", "audio", "response.done"]
        assert list(h.session.history) == [("assistant", "Hello there.")]
        assert not h.engine.requests and not h.of("turn.trace")


async def test_ahead_of_endpoint_recognition_and_prefill_are_reused() -> None:
    async with Harness() as h:
        await h.feed(tone(1200), pause_s=0.02)  # paced, so partials agree and the text is committed
        await h.feed(quiet(700), pause_s=0.005)
        trace = await h.wait_for("turn.trace")
        prefill, real = h.engine.requests
        assert prefill.sampling.max_new_tokens == 0 and real.sampling.max_new_tokens == 50
        assert prefill.messages == real.messages  # the committed partial was the final text
        prompt_words = len(prefill.messages) + sum(len(m.content.split()) for m in prefill.messages)
        assert trace["llm"]["reused_tokens"] == prompt_words and trace["llm"]["prefill_tokens"] == 0
        ahead = trace["ahead"]
        assert (ahead["prefill_tokens"], ahead["reused_tokens"], ahead["discarded"]) == (prompt_words, prompt_words, 0)
        assert trace["stages_ms"]["asr"] <= 0  # recognition finished before the endpoint
        assert ahead["asr_ms"] > 0 and ahead["prefill_ms"] > 0
        assert ahead["saved_ms"] == pytest.approx(ahead["asr_ms"] + ahead["prefill_ms"], abs=0.01)
        assert len(h.of("transcript.final")) == 1


async def test_the_ahead_prefill_is_of_the_final_transcript_and_the_reply_does_not_wait_for_it() -> None:
    # a final decode (0.3 s) inside the 500 ms hangover (fed at about real time), then a prefill (1.5 s) that outlasts it
    engine = FakeEngine(prefill_s=1.5)
    async with Harness(engine=engine, transcriber=FakeTranscriber(delay_s=0.3)) as h:
        await h.feed(tone(1600), pause_s=0.02)
        await h.feed(quiet(700), pause_s=0.02)
        trace = await h.wait_for("turn.trace", timeout_s=30)
        prefill, real = engine.requests
        assert prefill.sampling.max_new_tokens == 0 and prefill.messages == real.messages
        assert prefill.messages[-1].content == "what is the weather like today"
        marks = h.traces[0].marks_ns
        prefill_submit_ns, real_submit_ns = engine.submitted_ns
        prefill_done_ns = engine.prefilled_ns[0]
        assert marks["asr_final"] <= prefill_submit_ns  # of the final text, as soon as it is known
        assert real_submit_ns < prefill_done_ns  # the reply's request queued behind it, nothing waited for it
        assert trace["llm"]["reused_tokens"] > 0 and trace["llm"]["queue_ms"] > 0
        ahead = trace["ahead"]
        assert ahead["reused_tokens"] == ahead["prefill_tokens"] > 0
        # only the prefill time before the reply's request started counts as saved (it ran on after that)
        assert 0 < ahead["prefill_ms"] < 1500.0


async def test_savings_count_only_the_prefill_tokens_the_reply_reused() -> None:
    from voice.listener import Utterance
    from voice.llm_bridge import LlmFinish
    from voice.trace import TurnTrace

    utt = Utterance(1, TurnTrace(1), 0.0, stt=None)  # type: ignore[arg-type]
    ms = 1_000_000
    utt.ahead_start_ns, utt.final_ns, utt.final_decode_ms = 100 * ms, 400 * ms, 240.0  # 10 ms of it waiting
    # the ahead prefill found 10 tokens cached, computed 40 more in 80 ms, ending at 300 ms
    utt.prefill_result = LlmFinish("length", prefill_ms=80.0, prefill_tokens=40, reused_tokens=10, decode_tokens=0,
                                   shared_prefix_tokens=10)  # the 10 cached ones copied from another session's slot
    utt.prefill_done_ns = 300 * ms
    # the final diverged from the committed text: the reply reused 35 tokens, 25 of them from the ahead prefill;
    # its own prefill ran 5 tokens in 15 ms (3 ms a token: 75 ms for 25), more than the 50 ms the ahead one took
    reply = LlmFinish("stop", prefill_ms=15.0, prefill_tokens=5, reused_tokens=35, decode_tokens=9)
    got = utt.savings(endpoint_ns=350 * ms, llm_start_ns=500 * ms, reply=reply)
    assert got == {"asr_ms": 250.0, "asr_decode_ms": 240.0, "prefill_ms": 50.0, "saved_ms": 300.0, "prefill_tokens": 40, "reused_tokens": 25,
                   "shared_prefix_tokens": 10, "discarded": 0, "warm_tokens": 0}  # fmt: skip
    # a reply request that started half-way through the prefill saved only the half that ran before it
    reply = LlmFinish("stop", prefill_ms=15.0, prefill_tokens=5, reused_tokens=50, decode_tokens=9)
    assert utt.savings(350 * ms, 260 * ms, reply)["prefill_ms"] == 40.0
    # an ahead forward slowed by the final decode beside it claims no more than the reply's own pace (1 ms/token)
    reply = LlmFinish("stop", prefill_ms=5.0, prefill_tokens=5, reused_tokens=35, decode_tokens=9)
    assert utt.savings(350 * ms, 500 * ms, reply)["prefill_ms"] == 25.0
    # before the reply's reuse is known nothing is claimed for the prefill
    assert utt.savings(350 * ms)["prefill_ms"] == 0.0


async def test_speech_resuming_in_the_hangover_discards_the_ahead_work() -> None:
    transcriber = FakeTranscriber(delay_s=0.0)
    async with Harness(transcriber=transcriber) as h:
        await h.feed(tone(400))
        await h.feed(quiet(300), pause_s=0.01)  # shorter than the 500 ms hangover: same turn
        await h.feed(tone(400))
        await h.feed(quiet(700), pause_s=0.005)
        trace = await h.wait_for("turn.trace")
        assert len(h.of("vad.speech_started")) == 1 and len(h.of("transcript.final")) == 1
        assert trace["ahead"]["discarded"] == 1 and trace["ahead"]["prefill_ms"] == 0.0
        # the final decode that was used covers both stretches of speech
        assert max(transcriber.calls_ms) >= 1100.0
        assert h.engine.requests[-1].sampling.max_new_tokens == 50


async def test_resume_in_the_hangover_leaves_no_coroutine_unawaited() -> None:
    """All audio queued at once: the listen loop pauses and resumes without yielding, so the ahead tasks are
    cancelled before their first step (this once left 'coroutine Session._ahead was never awaited')."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with Harness() as h:
            audio = np.concatenate([tone(400), quiet(300), tone(400), quiet(700)])
            for i in range(0, len(audio), 320):
                h.session.push_audio(audio[i : i + 320], time.perf_counter_ns())
            trace = await h.wait_for("turn.trace")
            assert trace["ahead"]["discarded"] == 1
        gc.collect()
    unawaited = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert unawaited == []


async def test_empty_transcript_makes_no_reply() -> None:
    async with Harness(transcriber=FakeTranscriber(text="")) as h:
        await h.feed(tone(400))
        await h.feed(quiet(700))
        final = await h.wait_for("transcript.final")
        assert final["text"] == ""
        assert h.session.state == "idle"  # decided with the final, in the same step: a reply would be running now
        assert not h.of("response.done") and list(h.session.history) == []
        assert all(r.sampling.max_new_tokens == 0 for r in h.engine.requests)
        trace = await h.wait_for("turn.trace")  # the log still says why nothing answered
        assert trace["turn_id"] == final["turn_id"] and trace["no_words"] is True and "endpoint" in trace["marks_ms"]


async def test_engine_error_fails_the_reply_not_the_session() -> None:
    async with Harness(engine=FakeEngine(error="boom")) as h:
        h.session.text_input("hello")
        err = await h.wait_for("error")
        done = await h.wait_for("response.done")
        assert err["code"] == "reply_failed" and "boom" in err["message"] and not err["fatal"]
        assert done["interrupted"] and done["spoken_text"] == ""
        h.engine.error = None
        h.session.text_input("hello again")
        second = await h.wait_for("response.done", 2)
        assert not second["interrupted"] and second["text"]


async def test_a_finished_replys_trace_waits_for_the_clients_first_playback_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short reply is all sent before the client starts playing: its trace still gets playback_start."""
    import voice.replies as replies_module

    monkeypatch.setattr(replies_module, "TRACE_HOLD_S", 30.0)
    async with Harness() as h:
        h.session.text_input("hello")
        done = await h.wait_for("response.done")
        # held until the mark: the one trace (below) has the mark's arrival as its playback_start
        arrival = time.perf_counter_ns()
        h.session.playback_mark(done["turn_id"], 40.0, arrival)
        trace = await h.wait_for("turn.trace")
        marks = trace["marks_ms"]
        assert "playback_start" in marks and marks["first_audio_sent"] <= marks["playback_start"] + 40.0
        assert h.types().count("turn.trace") == 1 and len(h.traces) == 1


async def test_without_a_playback_mark_the_held_trace_is_sent_after_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    import voice.replies as replies_module

    monkeypatch.setattr(replies_module, "TRACE_HOLD_S", 0.05)
    async with Harness() as h:
        h.session.text_input("hello")
        trace = await h.wait_for("turn.trace")
        assert "playback_start" not in trace["marks_ms"] and "done" in trace["marks_ms"]
        assert h.types()[-2:] == ["response.done", "turn.trace"]


async def test_closing_the_session_sends_a_held_trace_to_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    import voice.replies as replies_module

    monkeypatch.setattr(replies_module, "TRACE_HOLD_S", 30.0)
    async with Harness() as h:
        h.session.text_input("hello")
        await h.wait_for("response.done")
        await h.session.close()
        assert len(h.traces) == 1 and "playback_start" not in h.traces[0].marks_ms()


async def test_the_prompt_is_cached_before_the_first_turn_and_again_after_a_persona_switch() -> None:
    async with Harness(warm_prompt=True) as h:
        h.session.text_input("hello")
        await h.wait_for("response.done")
        warm, reply = h.engine.requests
        assert [m.role for m in warm.messages] == ["system"] and warm.sampling.max_new_tokens == 0
        system_words = 1 + len(PERSONAS["assistant"].system_prompt.split())
        assert h.engine.finished[-1].timings.reused_tokens == system_words  # the reply found it cached
        h.session.update(persona="concise")
        h.session.text_input("hi")
        await h.wait_for("response.done", 2)
        warm_again, reply_again = h.engine.requests[2:]
        assert [(m.role, m.content) for m in warm_again.messages] == [("system", "Be brief."), *h.session.history[:2]]
        assert reply_again.messages[0].content == "Be brief." and reply_again.sampling.max_new_tokens == 3
        assert reply_again.messages[:-1] == warm_again.messages  # the new persona's prompt so far, warmed


async def test_many_tiny_messages_are_capped_by_count_too() -> None:
    """A history of one-character turns never reaches the character limit; the message cap drops its older half."""
    async with Harness(history_chars=100_000, history_messages=10, audio_lead_ms=UNPACED, summarise_history=False) as h:
        for i in range(12):
            h.session.text_input("a")
            await h.wait_for("response.done", i + 1)
            assert len(h.session.history) <= 10
        assert h.session.history[0][0] == "user"
        traces = [await h.wait_for("turn.trace", n) for n in range(1, 13)]
        # at 12 messages: the newest 5 are kept, less the reply that would open it (a history opens on the user)
        assert [t["context"]["dropped_messages"] for t in traces if "context" in t] == [8, 8]


async def test_a_long_conversation_drops_its_oldest_half_at_once_and_keeps_the_rest_stable() -> None:
    async with Harness(history_chars=400, warm_prompt=True, audio_lead_ms=UNPACED, summarise_history=False) as h:
        warmed_after_drop, opening = 0, None
        for i in range(12):
            h.session.text_input(f"question number {i} " + "x" * 40)
            await h.wait_for("response.done", i + 1)
            if opening is not None and h.session.history[0] != opening:  # this reply's end dropped some
                # the shorter prompt goes back into the cache at once: wait for it before the next turn
                prompt = [w for role, text in h.session.messages() for w in (role, *text.split())]
                async with asyncio.timeout(10):
                    while h.engine.slots.get("s1") != prompt:
                        await asyncio.sleep(0.005)
                warmed_after_drop += 1
            opening = h.session.history[0]
        traces = [await h.wait_for("turn.trace", n) for n in range(1, 13)]
        drops = [t["context"] for t in traces if "context" in t]
        assert drops and all(d["dropped_messages"] >= 4 for d in drops)  # in large steps, not one by one
        assert len(drops) <= 4  # 12 turns of ~100 characters each against a 400-character history
        assert warmed_after_drop > 0
        assert sum(len(text) for _, text in h.session.history) <= 400 + 200
        assert h.session.history[0][0] == "user"  # it never opens on a reply
        # between drops the prompt's prefix stays put: each request extends the one before
        requests = [r for r in h.engine.requests if r.sampling.max_new_tokens > 0]
        for before, after in zip(requests, requests[1:]):
            if after.messages[1] == before.messages[1]:
                assert after.messages[: len(before.messages)] == before.messages
        # and no turn pays for the drop: each reply reads at most the last exchange (the fake engine's cache
        # holds prompts, not the words it generated), never the whole kept history
        for trace, request in zip(traces, requests):
            last_two = sum(1 + len(m.content.split()) for m in request.messages[-2:])
            assert trace["llm"]["prefill_tokens"] <= last_two, trace
