"""web.otel.spans: a finished turn trace becomes the turn span with its stage spans at the trace's own marks, the
LLM call under GenAI's names, checks, barge-in and rejoin as events, and no text unless asked for."""
from __future__ import annotations

from voice.trace import TurnTrace
from web.otel.spans import LlmFacts, turn_spans

LLM = LlmFacts("SmolLM2-135M-Instruct", "parley")
MS = 1_000_000
VOICE_MARKS = {"speech_start": 0, "speech_end": 2000, "endpoint": 2310, "asr_final": 2350, "llm_start": 2355,
               "llm_first_token": 2420, "first_phrase": 2600, "tts_first_audio": 2790, "first_audio_sent": 2792,
               "playback_start": 2830, "done": 4100}  # fmt: skip


def voice_trace(**marks_ms: int) -> TurnTrace:
    t = TurnTrace(3, "sess1", {"voice_to_voice": 1800.0})
    for name, ms in {**VOICE_MARKS, **marks_ms}.items():
        t.mark(name, 5_000 * MS + ms * MS + 17)  # odd ns: durations must come from the marks, not rounded ms
    t.info.update(input="voice", persona="assistant", voice="joe",
                  turn={"end": "model", "checks": [{"silence_ms": 200.0, "audio_prob": 0.2, "text_prob": None, "decision": "stale"},
                                                   {"silence_ms": 300.0, "audio_prob": 0.9, "text_prob": 0.8, "decision": "end"}]},
                  llm={"finish": "stop", "prefill_tokens": 12, "reused_tokens": 140, "decode_tokens": 31, "queue_ms": 0.4,
                       "generate_ms": 900.5, "shared_prefix_tokens": 0},
                  ahead={"asr_ms": 120.0, "saved_ms": 150.0})  # fmt: skip
    t.texts.update(user="what is the time", reply="It is noon.")
    return t


def by_name(root):
    return {s.name: s for s in root.walk()}


def test_every_stage_is_a_span_with_the_traces_own_times() -> None:
    t = voice_trace()
    root = turn_spans(t, LLM)
    spans = by_name(root)
    assert root.name == "parley.turn" and root.start_ns == t.marks_ns["speech_start"] and root.end_ns == t.marks_ns["done"]
    stages = t.stages_ms()
    for name, stage in [("parley.endpointing", "endpointing"), ("parley.asr", "asr"), ("parley.phrase", "phrase"),
                        ("parley.tts", "tts"), ("parley.send", "send"), ("parley.llm.prefill", "llm_ttft")]:  # fmt: skip
        s = spans[name]
        assert abs((s.end_ns - s.start_ns) / 1e6 - stages[stage]) < 0.001, name
    llm = spans["chat SmolLM2-135M-Instruct"]
    assert llm.end_ns - llm.start_ns == int(900.5 * MS)
    assert [c.name for c in llm.children] == ["parley.llm.prefill", "parley.llm.decode"]
    assert spans["parley.llm.decode"].end_ns == llm.end_ns
    assert [c.name for c in root.children] == ["parley.endpointing", "parley.asr", "chat SmolLM2-135M-Instruct",
                                               "parley.phrase", "parley.tts", "parley.send"]  # fmt: skip
    assert root.attributes["parley.stage.voice_to_voice_ms"] == stages["voice_to_voice"]
    assert root.attributes["parley.turn.outcome"] == "done" and root.error is None


def test_the_llm_span_carries_the_genai_attributes() -> None:
    a = by_name(turn_spans(voice_trace(), LLM))["chat SmolLM2-135M-Instruct"].attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
    assert a["gen_ai.provider.name"] == "parley"
    usage = (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.cache_read.input_tokens"], a["gen_ai.usage.output_tokens"])
    assert usage == (152, 140, 31)
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert abs(a["gen_ai.response.time_to_first_chunk"] - 0.065) < 1e-9


def test_no_text_unless_asked() -> None:
    t = voice_trace()
    plain = [v for s in turn_spans(t, LLM).walk() for v in s.attributes.values()]
    assert not any(isinstance(v, str) and ("time" in v or "noon" in v) for v in plain)
    spans = by_name(turn_spans(t, LLM, include_text=True))
    assert spans["parley.asr"].attributes["parley.transcript"] == "what is the time"
    llm = spans["chat SmolLM2-135M-Instruct"].attributes
    assert "what is the time" in llm["gen_ai.input.messages"] and "It is noon." in llm["gen_ai.output.messages"]


def test_checks_resume_barge_in_and_rejoin_are_events() -> None:
    t = voice_trace(interrupted=3000)
    del t.marks_ns["done"]
    t.info["joins"] = 2
    root = turn_spans(t, LLM)
    endpointing = by_name(root)["parley.endpointing"]
    assert [e.name for e in endpointing.events] == ["parley.turn_check", "parley.resume", "parley.turn_check"]
    assert endpointing.events[0].t_ns == t.marks_ns["speech_end"] + 200 * MS
    assert endpointing.events[2].attributes["parley.check.decision"] == "end"
    assert [e.name for e in root.events] == ["parley.rejoin", "parley.playback_start", "parley.barge_in"]
    assert root.events[-1].t_ns == t.marks_ns["interrupted"] and root.attributes["parley.turn.outcome"] == "interrupted"


def test_recognition_ahead_of_the_endpoint_is_an_empty_span_with_its_negative_stage_time() -> None:
    t = voice_trace(asr_final=2200)
    asr = by_name(turn_spans(t, LLM))["parley.asr"]
    assert asr.start_ns == asr.end_ns == t.marks_ns["endpoint"] and asr.attributes["parley.stage_ms"] == -110.0


def test_a_failed_reply_is_an_error_and_a_typed_turn_has_no_hearing_spans() -> None:
    t = TurnTrace(1, "s")
    t.mark("llm_start", 10 * MS)
    t.mark("interrupted", 40 * MS)
    t.info.update(input="text", error="LlmFailed: engine gone")
    root = turn_spans(t, LLM)
    assert root.error == "LlmFailed: engine gone"
    assert [c.name for c in root.children] == ["chat SmolLM2-135M-Instruct"]
    llm = root.children[0]
    assert llm.end_ns == 40 * MS and "gen_ai.usage.input_tokens" not in llm.attributes
    assert turn_spans(TurnTrace(2, "s"), LLM) is None
