"""OpenTelemetry export from a real server: one spoken turn reaches a real OTLP/HTTP receiver as the session → turn →
stage tree, with the turn trace's stage times, the GenAI attributes and no text; a receiver that never answers
leaves the turns as they were and costs counted drops in a bounded queue."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from bench import corpus
from parley.config import AppConfig
from server_config import TOKEN
from bench._otlp import OtlpReceiver
from web.app import create_app
from web.otel.export import Telemetry, llm_facts
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

QUESTION = "What should I cook for dinner tonight with some rice and two eggs?"
STAGE_SPANS = {"parley.endpointing": "endpointing", "parley.asr": "asr", "parley.llm.prefill": "llm_ttft",
               "parley.phrase": "phrase", "parley.tts": "tts", "parley.send": "send"}  # fmt: skip


@pytest.fixture(scope="module")
def question_16k() -> np.ndarray:
    audio, rate = corpus.speak_piper(QUESTION)
    return np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1200)])


def observed(cfg: AppConfig, **keys: object) -> AppConfig:
    return cfg.model_copy(update={"observability": cfg.observability.model_copy(update=keys)})


@pytest.fixture
def exporting(live_server):
    """The shared live server with export switched on for one test (the config path is create_app's, checked below)."""
    state = live_server.state
    made: list[Telemetry] = []

    def switch(receiver: OtlpReceiver, **keys: object) -> Telemetry:
        cfg = observed(live_server.cfg, otlp_endpoint=receiver.url, schedule_delay_ms=50, **keys)
        state.telemetry = Telemetry(cfg.observability, llm_facts(cfg))
        made.append(state.telemetry)
        return state.telemetry

    yield switch
    state.telemetry = Telemetry.off()
    for t in made:
        t.shutdown()


async def spoken_turn(live_server, audio: np.ndarray) -> tuple[str, dict]:
    """One spoken question on a new session, played from its first audio; -> (session id, its turn.trace)."""
    async with Client(live_server.ws_url()) as c:
        ready = await c.start()
        await c.wait_for("response.done")  # the greeting
        await c.stream(audio)
        turn = (await c.wait_for("transcript.final"))["turn_id"]
        await c.wait_for("audio", turn_id=turn)
        await c.send(type="playback.mark", turn_id=turn, played_ms=0)
        trace = await c.wait_for("turn.trace", turn_id=turn, timeout_s=120)
    return ready["session_id"], trace


async def metrics_text(live_server) -> str:
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        return (await http.get("/metrics")).text


def sample(text: str, name: str) -> float:
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + " ")))


async def test_a_spoken_turn_arrives_as_its_span_tree(live_server, exporting, question_16k) -> None:
    receiver = OtlpReceiver()
    try:
        exporting(receiver)
        session_id, trace = await spoken_turn(live_server, question_16k)
        receiver.wait(lambda r: r.named("parley.session"), timeout_s=60)  # the session span ends when it closes
    finally:
        receiver.close()
    session = receiver.named("parley.session")[0]
    assert session.attributes["parley.session_id"] == session_id and session.attributes["parley.session.transport"] == "ws"
    turns = {s.attributes["parley.turn.id"]: s for s in receiver.named("parley.turn")}
    turn = turns[trace["turn_id"]]
    assert turn.parent_id == session.span_id and turn.attributes["parley.turn.input"] == "voice"
    assert {s.trace_id for s in receiver.spans} == {session.trace_id}
    mine = [s for s in receiver.spans if s.parent_id == turn.span_id]
    llm = next(s for s in mine if s.name.startswith("chat "))
    below = {s.name: s for s in mine + [s for s in receiver.spans if s.parent_id == llm.span_id]}
    for name, stage in STAGE_SPANS.items():
        want = max(0.0, trace["stages_ms"][stage])  # recognition that finished ahead of the endpoint is an empty span
        assert abs(below[name].duration_ms - want) < 1.0, (name, below[name].duration_ms, trace["stages_ms"][stage])
        assert below[name].attributes.get("parley.stage_ms", trace["stages_ms"][stage]) == trace["stages_ms"][stage]
    marks = trace["marks_ms"]
    assert abs(turn.duration_ms - max(marks.values())) < 1.0
    assert abs(llm.start_ns - turn.start_ns - marks["llm_start"] * 1e6) < 1e6
    a = llm.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == llm_facts(live_server.cfg).model
    assert a["gen_ai.usage.input_tokens"] == trace["llm"]["prefill_tokens"] + trace["llm"]["reused_tokens"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == trace["llm"]["reused_tokens"]
    assert a["gen_ai.usage.output_tokens"] == trace["llm"]["decode_tokens"] > 0
    assert abs(a["gen_ai.response.time_to_first_chunk"] * 1000 - trace["stages_ms"]["llm_ttft"]) < 0.01
    assert [e[0] for e in below["parley.endpointing"].events].count("parley.turn_check") == len(trace["turn"]["checks"])
    assert "parley.playback_start" in [e[0] for e in turn.events]
    strings = [v for s in receiver.spans for v in s.attributes.values() if isinstance(v, str)]
    assert not any("dinner" in v.lower() for v in strings)  # no text by default (a typed turn's: the test below)


async def test_a_collector_that_never_answers_changes_nothing_but_the_drop_count(live_server, exporting, question_16k) -> None:
    hung = OtlpReceiver(hang=True)
    try:
        # the spoken turn's spans (the turn, its stages, the model call) end together, more than the bound of three;
        # an export waits 2 s for the hung collector, and so does the shutdown after the test
        tel = exporting(hung, max_queue_spans=3, max_export_batch=2, export_timeout_s=2.0)
        _, trace = await spoken_turn(live_server, question_16k)
        hung.wait(lambda r: r.requests >= 1)
        text = await metrics_text(live_server)
    finally:
        hung.close()
    # the turn is whole: every mark and stage as with export off (tests/server/test_conversation.py)
    assert set(trace["stages_ms"]) == {"endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"}
    assert "done" in trace["marks_ms"]
    assert sample(text, 'parley_otel_spans_total{outcome="exported"}') == 0
    assert sample(text, "parley_otel_queue_spans") <= 3  # the bound holds while the collector hangs
    assert sample(text, 'parley_otel_spans_total{outcome="dropped"}') > 0 and tel.counts.dropped > 0


def test_the_config_turns_export_on(live_server) -> None:
    receiver = OtlpReceiver()
    try:
        cfg = observed(live_server.cfg, otlp_endpoint=receiver.url)
        telemetry = create_app(cfg, runtime=live_server.runtime).state.parley.telemetry
        assert telemetry.enabled and telemetry.target == receiver.url + "/v1/traces"
        telemetry.shutdown()
        assert not create_app(live_server.cfg, runtime=live_server.runtime).state.parley.telemetry.enabled
    finally:
        receiver.close()


async def test_a_realtime_session_is_a_session_span(live_server, exporting) -> None:
    from websockets.asyncio.client import connect

    receiver = OtlpReceiver()
    try:
        exporting(receiver)
        url = f"ws://127.0.0.1:{live_server.port}/v1/realtime?model=parley"
        async with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:  # type: ignore[list-item]
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created"
        receiver.wait(lambda r: any(s.attributes.get("parley.session.transport") == "realtime" for s in r.named("parley.session")))
    finally:
        receiver.close()
    (span,) = [s for s in receiver.named("parley.session") if s.attributes.get("parley.session.transport") == "realtime"]
    assert span.attributes["parley.session.model"] == "parley" and span.parent_id == ""


async def test_text_only_when_allowed(live_server, exporting) -> None:
    receiver = OtlpReceiver()
    try:
        exporting(receiver, include_text=True)
        async with Client(live_server.ws_url()) as c:
            await c.start()
            await c.wait_for("response.done")  # the greeting
            await c.send(type="input.text", text="Say hello to the tracing backend.")
            done = await c.wait_for("response.done", n=2, timeout_s=120)
            await c.wait_for("turn.trace", turn_id=done["turn_id"], timeout_s=60)
        receiver.wait(lambda r: r.named("parley.session"))
    finally:
        receiver.close()
    session = receiver.named("parley.session")[0]
    turn = next(s for s in receiver.named("parley.turn") if s.attributes["parley.turn.id"] == done["turn_id"])
    assert turn.attributes["parley.turn.input"] == "text" and turn.parent_id == session.span_id  # a typed turn's span
    assert turn.attributes["parley.text.user"] == "Say hello to the tracing backend."
    assert turn.attributes["parley.text.reply"] == done["text"]
    llm = next(s for s in receiver.spans if s.parent_id == turn.span_id and s.name.startswith("chat "))
    assert json.loads(llm.attributes["gen_ai.input.messages"])[0]["parts"][0]["content"] == "Say hello to the tracing backend."
    assert json.loads(llm.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"] == done["text"]
