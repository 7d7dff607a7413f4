"""The preemptive first phrase run by a Session on fakes (voice.first_phrase): the reply continues the request made
in the pause (one generation request in all, its phrase's audio not synthesised twice); speech that comes back drops
it and the trace counts the waste. Waits for events, never for time."""
from __future__ import annotations

import pytest

from fakes import FakeEngine, FakeTranscriber, Harness, quiet, tone
from voice.turn_policy import TurnPolicy

pytestmark = pytest.mark.timeout(60)

HALF, WHOLE = "can you tell me the capital of", "can you tell me the capital of australia"


def generations(engine: FakeEngine) -> list:
    return [r for r in engine.requests if r.sampling.max_new_tokens > 0]


async def test_the_reply_continues_the_request_made_in_the_pause() -> None:
    async with Harness(turns=TurnPolicy(detection="fixed", hangover_ms=1500), preemptive_phrase=True) as h:
        await h.feed(tone(800))
        await h.feed(quiet(3000), until=lambda: bool(h.of("response.done")))
        trace = await h.wait_for("turn.trace")
        done = h.of("response.done")[0]
        assert trace["preemptive"] == "hit", trace
        assert trace["preemptive_waste"] == {"tokens": 0, "tts_ms": 0.0, "session_tokens": 0, "session_tts_ms": 0.0}
        times = trace["preemptive_ms"]
        assert times["start"] < times["phrase"] <= times["ready"] < 0  # all of it in the pause
        (generation,) = generations(h.engine)  # the reply made no request of its own
        assert h.engine.requests[0].sampling.max_new_tokens == 0 and generation.messages == h.engine.requests[0].messages
        assert done["text"] == " ".join(h.engine.reply_words) and not done["interrupted"]
        assert h.engine.requests[-1] is generation and h.session.preempt.core.held is None


async def test_speech_that_comes_back_drops_the_held_phrase_and_counts_its_tokens() -> None:
    transcriber = FakeTranscriber(by_length=[(100.0, HALF), (1500.0, WHOLE)])
    engine = FakeEngine(token_s=0.002)
    policy = TurnPolicy(detection="fixed", hangover_ms=1500)
    async with Harness(transcriber=transcriber, engine=engine, turns=policy, preemptive_phrase=True) as h:
        await h.feed(tone(800))
        await h.feed(quiet(600), until=lambda: h.session.preempt.core.ready)
        assert h.session.preempt.core.ready, "the phrase was not made within the pause"
        await h.feed(tone(500))  # the request goes on: the held phrase is stale
        await h.feed(quiet(3000), until=lambda: bool(h.of("response.done")))
        trace = await h.wait_for("turn.trace")
        assert trace["preemptive"] == "hit" and [m["text"] for m in h.of("transcript.final")] == [WHOLE]
        waste = trace["preemptive_waste"]
        assert waste["tokens"] > 0 and waste["tts_ms"] > 0 and waste["session_tokens"] == waste["tokens"], waste
        first, second = generations(engine)
        assert first.messages[-1].content == HALF and second.messages[-1].content == WHOLE
        assert h.session.preempt.wasted_tokens == waste["tokens"]


async def test_without_preemption_the_trace_has_no_field_and_the_reply_makes_its_own_request() -> None:
    async with Harness(turns=TurnPolicy(detection="fixed", hangover_ms=600)) as h:
        await h.feed(tone(800))
        await h.feed(quiet(3000), until=lambda: bool(h.of("response.done")))
        trace = await h.wait_for("turn.trace")
        assert "preemptive" not in trace and len(generations(h.engine)) == 1


async def test_partials_warm_the_prompt_while_the_user_speaks() -> None:
    """Each partial's words go into the cache as the reply's prompt (a prefill), so the pause's prefill starts from
    what they share; none while paused, and none with warm_partials off."""
    transcriber = FakeTranscriber(by_length=[(400.0, HALF), (1300.0, WHOLE)])
    for warm in (True, False):
        engine = FakeEngine()
        async with Harness(transcriber=transcriber, engine=engine, turns=TurnPolicy(detection="fixed", hangover_ms=600),
                           warm_partials=warm) as h:  # fmt: skip
            await h.feed(tone(1800))
            await h.feed(quiet(2000), until=lambda: bool(h.of("response.done")))
            trace = await h.wait_for("turn.trace")
        prefills = [r.messages[-1].content for r in engine.requests if r.sampling.max_new_tokens == 0]
        if warm:
            assert prefills[0] == HALF and prefills[-1] == WHOLE, prefills  # the partials', then the pause's
            assert trace["ahead"]["warm_tokens"] > 0, trace["ahead"]
        else:
            assert prefills == [WHOLE] and trace["ahead"]["warm_tokens"] == 0
