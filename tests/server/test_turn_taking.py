"""Turn-taking over a real socket with the embedded models and the shipped detection (combined): a pause inside a
request keeps one turn, a finished question ends soon after its last word, and speech soon after an early endpoint
joins the request it continues. Audio is streamed at real time; endpoints are measured in audio time."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench import corpus
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEAD_MS = 300.0
# Audio the VAD needs on each side of a pause: Silero's ~60 ms to see the silence that starts the check's count,
# and the continuation's first frames before speech is heard again (a fresh clone saw a check of 536 ms go stale
# in a 700 ms pause: 160 + 536 < 700)
VAD_SLACK_MS = 150.0


def too_slow_here(trace: dict[str, Any], vad: Any, pause_ms: float) -> str | None:
    """Why this machine's end-of-turn check could not answer within the silence the audio gives it, or None.

    A check waits for the work ahead (the final recognition, then the engine's prefill) and the audio model;
    on a slow machine (a 2-vCPU AVX2 VM: ~600 ms a check, against ~70 on the development machine) it answers
    after speech has resumed or after the 1 s hold, and the policy these tests assert is never asked. That is
    the machine's speed, which bench/turns.py and bench/e2e.py measure; it is reported as a skip, not a pass."""
    checks = trace["turn"]["checks"]
    for ch in checks:
        if ch["decision"] == "stale" and vad.turn_check_ms + ch["cost_ms"] + VAD_SLACK_MS >= pause_ms:
            return (f"an end-of-turn check took {ch['cost_ms']:.0f} ms on this machine, so it answered after the "
                    f"{pause_ms:.0f} ms pause had ended")  # fmt: skip
    ahead = trace.get("ahead") or {}
    ahead_ms = float(ahead.get("asr_ms", 0.0)) + float(ahead.get("prefill_ms", 0.0))
    answered = [ch for ch in checks if ch["decision"] not in ("stale", "unanswered")]
    if trace["turn"]["end"] == "max_hangover" and not answered and vad.ahead_silence_ms + ahead_ms >= vad.max_hangover_ms:
        return (f"the work ahead that a check waits for took {ahead_ms:.0f} ms on this machine, past the "
                f"{vad.max_hangover_ms} ms hold")  # fmt: skip
    return None


async def converse(c: Client, audio: np.ndarray) -> None:
    """After the greeting, stream `audio`, then silence until a reply to it has been spoken to the end."""
    await c.start()
    await c.wait_for("response.done")  # the greeting
    await c.stream(audio)
    await c.stream(corpus.silence(10000), until=lambda: len([d for d in c.of("response.done") if not d["interrupted"]]) > 1)


async def test_a_request_with_a_700_ms_pause_in_the_middle_is_one_turn(live_server) -> None:
    first, second = "Can you tell me the capital of", "Australia?"
    speech, _ = corpus.speak_paused(first, second, "piper-steady", 700)
    async with Client(live_server.ws_url()) as c:
        await converse(c, np.concatenate([corpus.silence(LEAD_MS), speech]))
        finals = c.of("transcript.final")
        assert len(c.of("vad.speech_started")) == 1 and len(finals) == 1, c.types()
        assert corpus.wer(f"{first} {second}", finals[0]["text"]) <= 0.25, finals[0]["text"]
        trace = await c.wait_for("turn.trace", turn_id=finals[0]["turn_id"])
        if slow := too_slow_here(trace, live_server.cfg.vad, 700.0):
            pytest.skip(slow)
        checks = trace["turn"]["checks"]
        assert [ch["decision"] for ch in checks] == ["wait", "end"], checks  # heard the half sentence as unfinished
        assert checks[0]["text_prob"] < 0.01 < checks[1]["text_prob"]


async def test_a_finished_question_ends_within_350_ms_of_its_last_word_plus_its_check(live_server) -> None:
    """Measured on the client's audio clock (streamed at real time): how much audio after the last voiced
    sample had been sent when vad.speech_ended arrived, less the check's own compute (recognising the turn,
    the engine's text probability, the audio model), which is the machine's speed and is benchmarked in
    bench/e2e.py, not asserted here. What is left is the policy: the first check, asked early in the pause,
    ends a finished question at once. The median of three questions."""
    questions = ["What is the capital of France?", "What time is it right now?", "Turn off the lights in the kitchen."]
    delays, computes = [], []
    for q in questions:
        speech = corpus._trim(corpus.speak(q, "piper-steady"))
        _, end_ms = corpus.speech_bounds_ms(speech, corpus.ASR_RATE)
        async with Client(live_server.ws_url()) as c:
            await c.start()
            await c.wait_for("response.done")
            start_ms = c.audio_sent_ms
            await c.stream(np.concatenate([corpus.silence(LEAD_MS), speech, corpus.silence(3000)]),
                           until=lambda: bool(c.of("vad.speech_ended")))  # fmt: skip
            ended = await c.wait_for("vad.speech_ended")
            trace = await c.wait_for("turn.trace")
            if slow := too_slow_here(trace, live_server.cfg.vad, 3000.0):
                pytest.skip(slow)
            assert trace["turn"]["end"] == "complete", trace["turn"]
            checks = trace["turn"]["checks"]
            assert [ch["decision"] for ch in checks] == ["end"], checks  # the first check ends it
            delays.append(ended["audio_sent_ms"] - (start_ms + LEAD_MS + end_ms))
            computes.append(checks[0]["cost_ms"])
    print(f"\nendpoint after the last voiced sample (audio ms): {[round(d) for d in delays]}; "
          f"of which the check's compute: {[round(c) for c in computes]}")  # fmt: skip
    assert sorted(d - c for d, c in zip(delays, computes))[1] <= 350.0, (delays, computes)


async def test_speech_soon_after_an_early_endpoint_joins_the_request(live_server) -> None:
    """'Turn off the lights.' spoken as a finished sentence, 700 ms of silence, '... in the living room.': the first
    half is a whole request to the detector, so its reply starts; the continuation stops it and joins it."""
    first = corpus._trim(corpus.speak("Turn off the lights.", "piper-steady"))
    second = corpus._trim(corpus.speak("In the living room.", "piper-steady"))
    audio = np.concatenate([corpus.silence(LEAD_MS), first, corpus.silence(700), second])
    async with Client(live_server.ws_url()) as c:
        await converse(c, audio)
        started = c.of("vad.speech_started")
        if len(started) == 1:  # no early endpoint: the first half's check may not have answered within the pause
            whole = await c.wait_for("turn.trace", turn_id=c.of("transcript.final")[-1]["turn_id"])
            if slow := too_slow_here(whole, live_server.cfg.vad, 700.0):
                pytest.skip(slow)
        assert len(started) == 2 and started[1]["joins"] is not None, c.types()
        early = started[1]["joins"]
        final = c.of("transcript.final")[-1]
        assert corpus.wer("Turn off the lights in the living room.", final["text"]) <= 0.25, final["text"]
        done = [d for d in c.of("response.done") if d["turn_id"] in (early, final["turn_id"])]
        assert [d["turn_id"] for d in done if not d["interrupted"]] == [final["turn_id"]]  # only the whole is answered
        assert all(d["interrupted"] for d in done if d["turn_id"] == early)
        trace = await c.wait_for("turn.trace", turn_id=final["turn_id"])
        assert trace["joins"] == early
        # What the user heard of the early reply, on the client's clock (the audio streams at real time and the
        # early reply's audio plays as it arrives): the pause less the reply's own latency (machine speed), plus
        # how long the continuation took to stop it, which is the safety net's part and is what is asserted.
        early_audio = c.of("audio", turn_id=early)
        rate = c.of("session.ready")[0]["output_sample_rate"]
        received_ms = 1000.0 * sum(len(m["pcm"]) for m in early_audio) / 2 / rate
        clear = c.of("response.audio.clear", turn_id=early)
        assert clear, c.types()  # the early reply was stopped as a barge-in is
        heard_ms = min(received_ms, clear[0]["audio_sent_ms"] - early_audio[0]["audio_sent_ms"]) if early_audio else 0.0
        resumed_ms = LEAD_MS + 1000.0 * len(first) / corpus.ASR_RATE + 700.0  # the continuation's first sample
        stopped_ms = clear[0]["audio_sent_ms"] - resumed_ms
        print(f"\nheard of the early reply: {heard_ms:.0f} ms (received {received_ms:.0f} ms); stopped "
              f"{stopped_ms:.0f} ms into the continuation")  # fmt: skip
        assert stopped_ms <= 400.0, (stopped_ms, heard_ms)  # measured ~150 ms: the VAD hearing speech
