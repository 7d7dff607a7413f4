"""web.otel.export against a real OTLP/HTTP receiver: the session → turn → stage tree in one trace with the trace's
times; off unless an endpoint is set; a collector that never answers costs a bounded queue and counted drops."""
from __future__ import annotations

import pytest

from parley.config import ObservabilityConfig
from bench._otlp import OtlpGrpcReceiver, OtlpReceiver
from voice.trace import TurnTrace
from web.otel.export import Telemetry, export_protocol, export_target, traces_url
from web.otel.spans import LlmFacts

LLM = LlmFacts("tiny", "parley")
MS = 1_000_000
MARKS = ["speech_start", "speech_end", "endpoint", "asr_final", "llm_start", "llm_first_token", "first_phrase",
         "tts_first_audio", "first_audio_sent", "done"]  # fmt: skip
SPANS_PER_TURN = 9  # turn, endpointing, asr, chat, prefill, decode, phrase, tts, send


def finished_turn(turn_id: int, session_id: str = "s1") -> TurnTrace:
    t = TurnTrace(turn_id, session_id)
    for i, m in enumerate(MARKS):
        t.mark(m, 7_000 * MS + turn_id * 10_000 * MS + i * 37 * MS + 123)
    t.info.update(input="voice", llm={"finish": "stop", "prefill_tokens": 4, "reused_tokens": 9, "decode_tokens": 5,
                                      "generate_ms": 200.0})  # fmt: skip
    t.texts.update(user="secret words", reply="secret reply")
    return t


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def test_a_turn_arrives_as_one_tree_with_the_traces_times(receiver: OtlpReceiver) -> None:
    cfg = ObservabilityConfig(otlp_endpoint=receiver.url, schedule_delay_ms=20, service_name="parley-test")
    tel = Telemetry(cfg, LLM, env={})
    tel.session_opened("s1", transport="ws")
    trace = finished_turn(1)
    tel.turn(trace)
    tel.session_closed("s1")
    receiver.wait(lambda r: len(r.spans) == SPANS_PER_TURN + 1)
    tel.shutdown()
    spans = {s.name: s for s in receiver.spans}
    session, turn = spans["parley.session"], spans["parley.turn"]
    assert len({s.trace_id for s in receiver.spans}) == 1 and session.parent_id == "" and session.service == "parley-test"
    assert turn.parent_id == session.span_id and turn.attributes["parley.session_id"] == "s1"
    for name in ("parley.endpointing", "parley.asr", "chat tiny", "parley.phrase", "parley.tts", "parley.send"):
        assert spans[name].parent_id == turn.span_id, name
    assert spans["parley.llm.prefill"].parent_id == spans["chat tiny"].span_id
    stages = trace.stages_ms()
    for name, stage in [("parley.endpointing", "endpointing"), ("parley.asr", "asr"), ("parley.llm.prefill", "llm_ttft"),
                        ("parley.phrase", "phrase"), ("parley.tts", "tts"), ("parley.send", "send")]:  # fmt: skip
        assert abs(spans[name].duration_ms - stages[stage]) < 1.0, name
    assert abs(turn.duration_ms - (trace.marks_ns["done"] - trace.marks_ns["speech_start"]) / 1e6) < 1.0
    assert spans["chat tiny"].attributes["gen_ai.usage.output_tokens"] == 5
    assert not any("secret" in str(v) for s in receiver.spans for v in s.attributes.values())
    assert "parley_otel_spans_total{outcome=\"exported\"} 10" in tel.exposition()


def test_grpc_export_reaches_a_grpc_collector_with_the_same_tree() -> None:
    receiver = OtlpGrpcReceiver()
    try:
        cfg = ObservabilityConfig(otlp_endpoint=receiver.url, otlp_protocol="grpc", schedule_delay_ms=20,
                                  headers={"Authorization": "Bearer t"})  # fmt: skip
        tel = Telemetry(cfg, LLM, env={})
        assert tel.target == receiver.url  # the address as it is: no /v1/traces on a gRPC endpoint
        tel.session_opened("s1")
        tel.turn(finished_turn(1))
        tel.session_closed("s1")
        receiver.wait(lambda r: len(r.spans) == SPANS_PER_TURN + 1)
        tel.shutdown()
        spans = {s.name: s for s in receiver.spans}
        assert spans["parley.turn"].parent_id == spans["parley.session"].span_id and receiver.requests >= 1
        assert tel.counts.exported == SPANS_PER_TURN + 1
    finally:
        receiver.close()


def test_the_protocol_comes_from_the_config_else_the_standard_variables() -> None:
    http, grpc = ObservabilityConfig(), ObservabilityConfig(otlp_protocol="grpc")
    assert export_protocol(http, {}) == "http/protobuf" and export_protocol(grpc, {}) == "grpc"
    assert export_protocol(http, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert export_protocol(http, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == "grpc"
    assert export_protocol(grpc, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == "grpc"  # the config wins
    assert export_protocol(http, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) == "http/protobuf"  # said in the log
    assert export_target(ObservabilityConfig(otlp_endpoint="http://c:4317", otlp_protocol="grpc"), {}) == "http://c:4317"


def test_a_collector_that_never_answers_costs_a_bounded_queue_and_counted_drops() -> None:
    hung = OtlpReceiver(hang=True)
    try:
        cfg = ObservabilityConfig(otlp_endpoint=hung.url, max_queue_spans=8, max_export_batch=2, schedule_delay_ms=10,
                                  export_timeout_s=1.0)  # fmt: skip
        tel = Telemetry(cfg, LLM, env={})
        tel.session_opened("s1")
        for turn_id in range(1, 6):
            tel.turn(finished_turn(turn_id))
            c = tel.counts
            assert c.waiting <= cfg.max_queue_spans  # never more held than the bound, whatever the collector does
        hung.wait(lambda r: r.requests >= 1)
        c = tel.counts
        assert c.exported == 0 and c.dropped >= 5 * SPANS_PER_TURN - cfg.max_queue_spans - 2 * cfg.max_export_batch
        assert c.dropped + c.failed + c.waiting + cfg.max_export_batch >= 5 * SPANS_PER_TURN
        tel.shutdown()  # gives up after one export timeout: what was left is counted, not sent
        assert c.exported == 0 and c.dropped + c.failed + c.waiting == 5 * SPANS_PER_TURN + 1  # the session span too
        assert f'parley_otel_spans_total{{outcome="dropped"}} {c.dropped}' in tel.exposition()
    finally:
        hung.close()


def test_sampling_zero_sends_nothing(receiver: OtlpReceiver) -> None:
    tel = Telemetry(ObservabilityConfig(otlp_endpoint=receiver.url, sample_ratio=0.0, schedule_delay_ms=10), LLM, env={})
    tel.session_opened("s1")
    tel.turn(finished_turn(1))
    tel.session_closed("s1")
    tel.shutdown()
    assert receiver.spans == [] and tel.counts.exported == tel.counts.dropped == 0


def test_off_by_default_on_with_the_config_or_the_standard_variables() -> None:
    off = ObservabilityConfig()
    assert export_target(off, {}) is None and not Telemetry(off, LLM, env={}).enabled
    assert export_target(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "env"
    assert export_target(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == "env"
    on = ObservabilityConfig(otlp_endpoint="http://jaeger:4318")
    assert export_target(on, {}) == "http://jaeger:4318/v1/traces"
    assert export_target(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert traces_url("http://tempo:4318/") == "http://tempo:4318/v1/traces"
    langfuse = "https://cloud.langfuse.com/api/public/otel/v1/traces"
    assert traces_url(langfuse) == langfuse
    off_tel = Telemetry.off()
    off_tel.session_opened("s")
    off_tel.turn(finished_turn(1, "s"))
    off_tel.session_closed("s")
    assert off_tel.exposition() == "" and off_tel.counts.waiting == 0
