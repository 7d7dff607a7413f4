"""A spoken conversation over a real socket with the embedded models: question in, spoken answer out, in order,
with a complete turn trace; /metrics, /api/traces and the trace log record it."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from bench import corpus
from server_config import TOKEN
from ws_client import Client
from voice.audio import pcm16_to_float, resample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

QUESTION = "Please tell me how long it takes to boil an egg and what I should cook for dinner tonight and remind me to call my mother tomorrow morning."  # ~6 s: room for partials on a busy machine
ALL_MARKS = ["speech_start", "speech_end", "endpoint", "asr_final", "llm_start", "llm_first_token", "first_phrase",
             "tts_first_audio", "first_audio_sent", "playback_start", "done"]  # fmt: skip


@pytest.fixture(scope="module")
def question_16k() -> np.ndarray:
    audio, rate = corpus.speak_piper(QUESTION)
    return np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1200)])


async def test_spoken_question_gets_a_spoken_answer_and_a_complete_trace(live_server, question_16k) -> None:
    async with Client(live_server.ws_url()) as c:
        ready = await c.start()
        assert ready["output_sample_rate"] == 22050 and ready["persona"] == "assistant" and ready["voice"] == "joe"
        greeting = await c.wait_for("response.done")  # the greeting comes first; the user talks after it
        assert greeting["text"].startswith("Hi, I'm Parley")
        await c.stream(question_16k)
        final = await c.wait_for("transcript.final")
        turn = final["turn_id"]
        await c.wait_for("audio", turn_id=turn)
        await c.send(type="playback.mark", turn_id=turn, played_ms=0)  # the client starts playing now
        trace = await c.wait_for("turn.trace", turn_id=turn, timeout_s=120)
        done = c.of("response.done", turn)[0]

        assert corpus.wer(QUESTION, final["text"]) <= 0.15, final["text"]
        # order: speech started, partials, speech ended, final, deltas, audio, done, trace
        idx = {id(m): i for i, m in enumerate(c.messages)}
        first = lambda kind: idx[id(c.of(kind, turn)[0] if kind not in ("vad.speech_started", "vad.speech_ended") else c.of(kind)[-1])]  # noqa: E731
        partials = [idx[id(m)] for m in c.of("transcript.partial", turn)]
        assert partials, f"no transcript.partial while the user spoke: {c.types()}"
        assert first("vad.speech_started") < min(partials) <= max(partials) < first("vad.speech_ended")
        order = ["vad.speech_ended", "transcript.final", "response.text.delta", "audio", "response.done", "turn.trace"]
        assert [first(k) for k in order] == sorted(first(k) for k in order)
        assert not done["interrupted"] and done["text"].strip()
        assert done["text"] == "".join(m["text"] for m in c.of("response.text.delta", turn))

        # the reply audio is speech saying the reply text
        audio = resample(pcm16_to_float(c.turn_audio(turn)), 22050, 16000)
        heard = live_server.runtime.stages.transcriber.transcribe(audio).text
        assert corpus.wer(done["spoken_text"], heard) <= 0.25, (done["spoken_text"], heard)
        seqs = [m["seq"] for m in c.of("audio", turn)]
        assert seqs == list(range(len(seqs)))

        assert list(trace["marks_ms"]) == ALL_MARKS
        assert trace["stages_ms"]["voice_to_voice"] > 0
        assert set(trace["stages_ms"]) == {"endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"}
        assert trace["budgets_ms"] == live_server.cfg.budgets_ms
        assert trace["over_budget"] == [s for s, v in trace["stages_ms"].items() if v > trace["budgets_ms"][s]]
        assert "saved_ms" in trace["ahead"] and trace["llm"]["finish"] in ("stop", "length")

    lines = [json.loads(line) for line in live_server.trace_log.read_text().splitlines()]
    assert any(t["turn_id"] == turn and t["session_id"] == ready["session_id"] for t in lines)
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        metrics = (await http.get("/metrics")).text
        traces = (await http.get("/api/traces")).json()["traces"]
        health = (await http.get("/healthz")).json()
        personas = (await http.get("/api/personas")).json()
    assert 'parley_turns_total{outcome="done"}' in metrics
    count = [line for line in metrics.splitlines() if line.startswith('parley_stage_latency_ms_count{stage="voice_to_voice"}')]
    assert count and int(count[0].split()[-1]) >= 1
    assert any(t["turn_id"] == turn and t["session_id"] == ready["session_id"] for t in traces)
    assert health["models_loaded"] is True
    assert [p["name"] for p in personas["personas"]] == ["assistant", "concise", "storyteller"]
    # tools: auto on the embedded model: none offered, and why (parley.tool_offer)
    assert all(p["tools"] == [] and "does not render tools" in p["tools_why"] for p in personas["personas"])


async def test_a_second_session_copies_the_persona_prefix_and_metrics_count_it(live_server) -> None:
    """The prefix cache across sessions on a real server: the second conversation with the same persona finds
    the system prompt's keys and values in the first one's slot, says so in its trace, and /metrics counts it."""
    llm = {}
    async with Client(live_server.ws_url()) as first:
        await first.start()
        await first.wait_for("response.done")
        for name in ("first", "second"):
            async with Client(live_server.ws_url()) as c:
                await c.start()
                await c.wait_for("response.done")  # the greeting
                await c.send(type="input.text", text="What is the capital of France?")
                trace = await c.wait_for("turn.trace", timeout_s=120)
                llm[name] = trace["llm"]
    assert llm["second"]["shared_prefix_tokens"] > 20, llm  # at least the persona's system prompt
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        metrics = (await http.get("/metrics")).text
    tokens = [line for line in metrics.splitlines() if line.startswith("parley_llm_prefix_cache_tokens_total ")]
    assert tokens and int(tokens[0].split()[-1]) >= llm["second"]["shared_prefix_tokens"]
    assert "# TYPE parley_llm_prefix_cache_hits_total counter" in metrics
