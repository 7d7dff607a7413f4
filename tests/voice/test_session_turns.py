"""End-of-turn detection and the safety net, run by a Session on fakes: which turn ends when, what the trace
records, and what the history keeps. Waits for events, never for time."""
from __future__ import annotations

import dataclasses

import pytest

from fakes import PERSONAS, FakeEngine, FakeTranscriber, FakeTurnModel, Harness, quiet, tone
from voice.session import Session
from voice.turn_policy import TurnPolicy

pytestmark = pytest.mark.timeout(60)

HALF, WHOLE = "can you tell me the capital of", "can you tell me the capital of australia"


def ended(h: Harness) -> bool:
    return bool(h.of("vad.speech_ended"))


async def test_text_detection_ends_a_finished_request_at_its_check_with_the_prompt_already_cached() -> None:
    async with Harness(turns=TurnPolicy(detection="text")) as h:
        await h.feed(tone(800))
        await h.feed(quiet(2500), until=lambda: ended(h))
        trace = await h.wait_for("turn.trace")
        turn = trace["turn"]
        assert turn["end"] == "complete"
        (check,) = turn["checks"]
        assert check["decision"] == "end" and check["text_prob"] == 0.9 and check["audio_prob"] is None
        policy = h.settings.turns
        assert check["silence_ms"] >= policy.turn_check_ms and check["wait_ms"] == policy.turn_check_ms
        probe, reply = h.engine.requests
        assert probe.probe_user_end and probe.sampling.max_new_tokens == 0 and probe.messages == reply.messages
        assert not reply.probe_user_end and trace["llm"]["prefill_tokens"] == 0  # the whole prompt came from the cache


async def test_a_pause_after_a_half_sentence_keeps_one_turn() -> None:
    transcriber = FakeTranscriber(by_length=[(100.0, HALF), (1500.0, WHOLE)])
    engine = FakeEngine(end_probs={HALF: 1e-4, WHOLE: 0.9})
    async with Harness(transcriber=transcriber, engine=engine, turns=TurnPolicy(detection="text")) as h:
        await h.feed(tone(800))
        await h.feed(quiet(700))
        await h.feed(tone(500))
        await h.feed(quiet(2500), until=lambda: ended(h))
        trace = await h.wait_for("turn.trace")
        assert len(h.of("vad.speech_started")) == 1 and [m["text"] for m in h.of("transcript.final")] == [WHOLE]
        assert [c["decision"] for c in trace["turn"]["checks"]] == ["wait", "end"]
        assert [c["text_prob"] for c in trace["turn"]["checks"]] == [1e-4, 0.9]
        assert trace["ahead"]["discarded"] == 1
        assert h.session.history[0] == ("user", WHOLE)


async def test_speech_soon_after_an_early_endpoint_joins_the_request_and_only_the_whole_is_answered() -> None:
    first, whole = "turn off the lights", "turn off the lights in the kitchen"
    transcriber = FakeTranscriber(by_length=[(100.0, first), (1100.0, whole)])
    long_reply = ("Okay, I will do that for you right now. " * 2).split()
    engine = FakeEngine(reply_words=long_reply, end_probs={first: 0.9, whole: 0.9})
    async with Harness(transcriber=transcriber, engine=engine, turns=TurnPolicy(detection="text", rejoin_window_ms=1000)) as h:
        await h.feed(tone(700))
        await h.feed(quiet(2500), until=lambda: bool(h.of("audio")), pause_s=0.02)  # the early reply starts playing
        early = h.of("audio")[0]["turn_id"]
        await h.feed(tone(500))  # "... in the kitchen"
        await h.feed(quiet(2500), until=lambda: len(h.of("vad.speech_ended")) == 2, pause_s=0.02)
        trace = await h.wait_for("turn.trace", 2)
        started = h.of("vad.speech_started")
        assert len(started) == 2 and started[1]["holds"] == early  # the early reply pauses at once
        assert h.of("turn.joined") == [{"type": "turn.joined", "turn_id": started[1]["turn_id"], "joins": early}]
        assert [m["turn_id"] for m in h.of("response.audio.clear")] == [early]
        done_early = h.of("response.done")[0]
        assert done_early["turn_id"] == early and done_early["interrupted"]
        assert h.of("transcript.final")[-1]["text"] == whole and transcriber.calls_ms[-1] >= 1200.0  # both stretches of speech
        await h.wait_for("response.done", 2)
        late = h.of("response.done")[1]
        assert not late["interrupted"] and late["turn_id"] == trace["turn_id"]
        assert list(h.session.history) == [("user", whole), ("assistant", late["text"])]  # one user turn: the whole request
        assert trace["joins"] == early and trace["turn"]["end"] == "complete"
        joined = next(t for t in h.traces if t.turn_id == early)
        assert joined.info["joined_into"] == trace["turn_id"]
        # the reply's prompt: the system prompt and the whole request, nothing of the early exchange
        assert [m.content for m in h.engine.requests[-1].messages][1:] == [whole]


async def test_smart_turn_detection_asks_the_audio_model_with_the_turns_audio() -> None:
    model = FakeTurnModel(prob=0.95)
    async with Harness(turn_model=model, turns=TurnPolicy(detection="smart_turn")) as h:
        await h.feed(quiet(300))
        await h.feed(tone(800))
        await h.feed(quiet(2500), until=lambda: ended(h))
        trace = await h.wait_for("turn.trace")
        (check,) = trace["turn"]["checks"]
        assert trace["turn"]["end"] == "complete" and check["audio_prob"] == 0.95 and check["text_prob"] is None
        assert 800.0 + 200.0 <= model.calls_ms[0] <= 800.0 + 220.0 + 300.0  # the speech, the silence so far, the pre-roll
        assert not any(r.probe_user_end for r in h.engine.requests)


async def test_the_audio_check_can_run_at_the_pause_on_the_silence_to_come() -> None:
    """audio_check_ahead: the audio model runs once a pause, as it starts, on the turn with the check's silence
    filled in, so it hears as much as the check would; speech that comes back drops that score and the next pause
    scores again."""
    policy = TurnPolicy(detection="smart_turn", turn_check_ms=400, max_hangover_ms=1000)
    heard: dict[bool, list[float]] = {}
    for ahead in (True, False):
        model = FakeTurnModel(prob=0.95)
        async with Harness(turn_model=model, turns=policy, audio_check_ahead=ahead) as h:
            await h.feed(tone(800))
            await h.feed(quiet(160), until=lambda: len(model.calls_ms) == 1)
            assert (len(model.calls_ms) == 1) == ahead and not ended(h)  # at the pause, or not before the check
            await h.feed(quiet(800.0 + 160.0 - h.audio_ms))  # the rest of the pause, when the call came first
            await h.feed(tone(500))  # the turn goes on
            await h.feed(quiet(2500), until=lambda: ended(h))
            trace = await h.wait_for("turn.trace")
        (check,) = trace["turn"]["checks"]
        assert check["audio_prob"] == 0.95 and trace["turn"]["end"] == "complete"
        heard[ahead] = model.calls_ms
    assert len(heard[True]) == 2 and len(heard[False]) == 1  # the first pause's score (dropped), and the second's
    assert abs(heard[True][-1] - heard[False][-1]) <= 40.0, heard  # the same audio, to a frame or two


async def test_a_check_that_waits_for_the_text_scores_the_audio_after_it_and_only_when_it_could_matter() -> None:
    """combined: the check waits for the final and its prefill anyway, so the audio model starts once they are done
    (the recognition the reply waits on has the cores), and not at all when the text alone fixes the wait; the
    audio model alone (smart_turn) scores beside the final."""
    said = "what is the weather like today"
    for detection, text_prob, audio_runs, after in (("combined", 0.05, True, True), ("combined", 0.9, False, None),
                                                   ("smart_turn", 0.9, True, False)):  # fmt: skip
        order: list[tuple[str, float]] = []

        class Logged(FakeTranscriber):
            def transcribe(self, audio):  # type: ignore[no-untyped-def]
                out = super().transcribe(audio)
                order.append(("asr", out.audio_ms))
                return out

        class LoggedModel(FakeTurnModel):
            def complete_prob(self, audio):  # type: ignore[no-untyped-def]
                order.append(("turn", 1000.0 * len(audio) / 16000))
                return super().complete_prob(audio)

        policy = TurnPolicy(detection=detection, turn_check_ms=400, max_hangover_ms=1000)
        assert policy.audio_can_change(text_prob) == audio_runs
        async with Harness(transcriber=Logged(text=said, delay_s=0.1), engine=FakeEngine(end_probs={said: text_prob}),
                           turn_model=LoggedModel(prob=0.95), turns=policy, audio_check_ahead=True) as h:  # fmt: skip
            await h.feed(tone(800))
            await h.feed(quiet(2500), until=lambda: ended(h))
            trace = await h.wait_for("turn.trace")
        check = trace["turn"]["checks"][0]
        assert (check["audio_prob"] == 0.95) == audio_runs and (check["audio_prob"] is None) == (not audio_runs), check
        if audio_runs:
            turn_at = next(i for i, (what, _) in enumerate(order) if what == "turn")
            final_at = next(i for i, (what, ms) in enumerate(order) if what == "asr" and ms > 800)  # the pause's final
            assert (final_at < turn_at) == after, (detection, order)
        else:
            assert all(what == "asr" for what, _ in order) and check["decision"] == "end", (order, check)


async def test_an_unsure_audio_model_waits_for_the_longest_hangover() -> None:
    policy = TurnPolicy(detection="smart_turn", max_hangover_ms=800)
    async with Harness(turn_model=FakeTurnModel(prob=0.05), turns=policy) as h:
        await h.feed(tone(600))
        at_ms = await h.feed(quiet(2500), until=lambda: ended(h))
        trace = await h.wait_for("turn.trace")
        assert trace["turn"]["end"] == "max_hangover" and trace["turn"]["checks"][0]["decision"] == "wait"
        assert at_ms is not None and at_ms >= 600.0 + 800.0  # no earlier than the longest hangover, in audio time


def test_a_detection_that_needs_the_audio_model_refuses_a_session_without_it() -> None:
    h = Harness()
    settings = dataclasses.replace(h.settings, turns=TurnPolicy(detection="combined"))
    with pytest.raises(ValueError, match="audio turn model"):
        Session("s2", h.stages, settings, PERSONAS, "assistant")


def test_the_text_probe_is_read_at_the_llms_own_even_odds() -> None:
    """Each model's probe has its own calibration (llm_engine.families): the session takes its LLM's, not SmolLM2's."""
    from llm_engine.families import family_of

    engine = FakeEngine()
    engine.family = family_of("Qwen2.5-Coder", "1.5B")  # type: ignore[attr-defined]
    h = Harness(engine=engine, turns=TurnPolicy(detection="text"))
    plain = Harness(turns=TurnPolicy(detection="text"))
    try:
        assert h.session.settings.turns.text_even_odds == engine.family.text_even_odds != TurnPolicy().text_even_odds  # type: ignore[attr-defined]
        assert plain.session.settings.turns.text_even_odds == TurnPolicy().text_even_odds
    finally:
        h.engine.stop()
        plain.engine.stop()
