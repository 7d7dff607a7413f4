"""The Realtime adapter's pure cores: what session.update means (web.realtime.config) and the session's messages
as Realtime events, in order (web.realtime.translate), on scripted inputs."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from voice.turn_policy import TurnPolicy
from web.realtime.config import NEVER_MS, RealtimeConfig, SessionIn
from web.realtime.translate import Translator

BASE = TurnPolicy(detection="combined")


def update(cfg: RealtimeConfig, session: dict) -> RealtimeConfig:
    return cfg.updated(SessionIn.model_validate(session))


def test_turn_detection_maps_onto_the_turn_policy() -> None:
    cfg = RealtimeConfig(voice="alloy", instructions="")
    assert cfg.turn_policy(BASE).detection == "combined"  # semantic_vad by default: Parley's own
    vad = update(cfg, {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 700,
                                                              "threshold": 0.6, "interrupt_response": False}}}})  # fmt: skip
    policy = vad.turn_policy(BASE)
    assert (policy.detection, policy.hangover_ms, policy.barge_in_min_speech_ms) == ("fixed", 700.0, NEVER_MS)
    assert vad.vad_threshold(0.5) == 0.6 and vad.to_wire("s", "m")["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 700
    eager = update(vad, {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    assert eager.turn_policy(BASE).max_hangover_ms == 800 and eager.vad_threshold(0.5) == 0.5
    manual = update(eager, {"audio": {"input": {"turn_detection": None}}})
    assert manual.turn_detection is None and manual.to_wire("s", "m")["audio"]["input"]["turn_detection"] is None
    kept = update(manual, {"instructions": "Be brief."})  # what an update does not name stays
    assert kept.turn_detection is None and kept.instructions == "Be brief."
    beta = update(cfg, {"turn_detection": {"type": "server_vad"}, "voice": "nova", "modalities": ["text"]})
    assert beta.turn_detection is not None and beta.turn_detection.type == "server_vad"
    assert (beta.voice, beta.modality) == ("nova", "text")


@pytest.mark.parametrize("session", [
    {"type": "transcription"}, {"audio": {"input": {"format": {"type": "audio/g729"}}}},
    {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
    {"audio": {"input": {"turn_detection": {"type": "psychic"}}}}, {"instructions": 5},
    {"output_modalities": ["audio", "text"]},
])  # fmt: skip
def test_what_cannot_be_honoured_is_refused(session: dict) -> None:
    with pytest.raises(ValidationError):
        SessionIn.model_validate(session)
    with pytest.raises(ValueError, match="tools"):
        update(RealtimeConfig(voice="alloy", instructions=""), {"tools": [{"type": "function", "name": "no spaces"}]})


def test_a_spoken_turn_and_its_answer_in_order() -> None:
    t = Translator()
    events = []
    for body in (
        {"type": "vad.speech_started", "turn_id": 1, "t_ms": 300.0},
        {"type": "transcript.partial", "turn_id": 1, "text": "What is"},
        {"type": "transcript.partial", "turn_id": 1, "text": "What is the"},
        {"type": "vad.speech_ended", "turn_id": 1, "t_ms": 1500.0},
        {"type": "transcript.final", "turn_id": 1, "text": "What is the time?"},
        {"type": "response.text.delta", "turn_id": 1, "text": "It is "},
    ):
        events += t.from_session(body)
    events += t.audio(1, b"\x00\x01" * 4)
    events += t.from_session({"type": "response.text.delta", "turn_id": 1, "text": "noon."})
    events += t.from_session({"type": "response.done", "turn_id": 1, "text": "It is noon.", "interrupted": False,
                              "spoken_text": "It is noon."})  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds == [
        "input_audio_buffer.speech_started", "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.delta", "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.input_audio_transcription.completed", "conversation.item.done",
        "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_audio_transcript.delta", "response.output_audio.delta", "response.output_audio_transcript.delta",
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done",
    ]  # fmt: skip
    user = events[0]["item_id"]
    assert [e["delta"] for e in events[1:3]] == ["What is", " the"]
    assert events[6]["item_id"] == user and events[6]["usage"]["seconds"] == pytest.approx(1.2)
    assistant = events[10]["item"]
    assert events[10]["previous_item_id"] == user and t.turn_of(assistant["id"]) == 1
    assert events[16]["transcript"] == "It is noon." and events[-1]["response"]["status"] == "completed"


def test_a_cough_commits_nothing_and_an_interrupted_answer_keeps_what_was_said() -> None:
    t = Translator()
    t.from_session({"type": "vad.speech_started", "turn_id": 1, "t_ms": 0.0})
    dropped = t.from_session({"type": "vad.speech_ended", "turn_id": 1, "t_ms": 150.0, "dropped": True})
    assert [e["type"] for e in dropped] == ["input_audio_buffer.speech_stopped"]
    t.from_session({"type": "response.text.delta", "turn_id": 2, "text": "Once upon a time there was"})
    t.cancelled.add(2)
    done = t.from_session({"type": "response.done", "turn_id": 2, "text": "Once upon a time there was",
                           "interrupted": True, "spoken_text": "Once upon"})  # fmt: skip
    final = done[-1]["response"]
    assert final["status"] == "cancelled" and final["status_details"]["reason"] == "client_cancelled"
    assert done[1]["transcript"] == "Once upon" and final["output"][0]["status"] == "incomplete"
    text = Translator(modality="text")
    events = text.from_session({"type": "response.text.delta", "turn_id": 1, "text": "Hi"}) + text.audio(1, b"\x00\x00")
    assert [e["type"] for e in events][-1] == "response.output_text.delta"  # no audio in a text-only answer


def test_session_tools_and_tool_choice_are_checked_and_echoed() -> None:
    weather = {"type": "function", "name": "weather", "description": "The weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
    cfg = update(RealtimeConfig(voice="alloy", instructions=""), {"tools": [weather], "tool_choice": "required"})
    assert [t.name for t in cfg.tools] == ["weather"] and cfg.tool_choice == "required"
    wire = cfg.to_wire("s", "m")
    assert wire["tools"] == [weather] and wire["tool_choice"] == "required"
    named = update(cfg, {"tool_choice": {"type": "function", "name": "weather"}})
    assert named.to_wire("s", "m")["tool_choice"] == {"type": "function", "name": "weather"}
    for bad, says in (({"tool_choice": {"type": "function", "name": "nope"}}, "not among the tools"),
                      ({"tools": [weather, weather]}, "unique"),
                      ({"tools": [{**weather, "parameters": {"type": "object", "properties": {"x": {"type": "wat"}}}}]}, "grammar"),
                      ({"tools": []}, "not among the tools")):  # dropping the tool a named choice names  # fmt: skip
        with pytest.raises(ValueError, match=says):
            update(named, bad)


def test_a_function_call_streams_as_its_item_and_argument_deltas() -> None:
    t = Translator()
    events = []
    for body in (
        {"type": "tool.call.started", "turn_id": 2, "call_id": "call_1", "name": "weather"},
        {"type": "tool.call.delta", "turn_id": 2, "index": 0, "arguments": '{"city": '},
        {"type": "tool.call.delta", "turn_id": 2, "index": 0, "arguments": '"Paris"}'},
        {"type": "tool.call.done", "turn_id": 2, "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "response.done", "turn_id": 2, "text": "", "interrupted": False, "spoken_text": "", "usage": None},
    ):
        events += t.from_session(body)
    assert [e["type"] for e in events] == [
        "response.created", "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done", "response.done",
    ]  # fmt: skip
    item = events[1]["item"]
    assert item["type"] == "function_call" and item["name"] == "weather" and item["call_id"] == "call_1"
    assert "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta")) == '{"city": "Paris"}'
    done = events[-1]["response"]
    assert done["status"] == "completed" and [o["type"] for o in done["output"]] == ["function_call"]
    assert done["output"][0]["arguments"] == '{"city": "Paris"}' and t.open_calls == {"call_1"}
