"""TurnTrace: marks, stage arithmetic, budgets and the message body (docs/protocol.md, Turn trace)."""
from __future__ import annotations

import pytest

from voice.trace import MARKS, STAGES, TurnTrace

MS = 1_000_000


def full_trace(budgets: dict[str, float]) -> TurnTrace:
    t = TurnTrace(7, "sess", budgets)
    at = {"speech_start": 0, "speech_end": 1000, "endpoint": 1500, "asr_final": 1400, "llm_start": 1510,
          "llm_first_token": 1700, "first_phrase": 1900, "tts_first_audio": 2300, "first_audio_sent": 2310,
          "playback_start": 2400, "done": 5000}  # fmt: skip
    for name, ms in at.items():
        t.mark(name, 10_000 * MS + ms * MS)
    return t


def test_stages_are_differences_of_marks_and_asr_may_be_negative() -> None:
    stages = full_trace({}).stages_ms()
    assert stages == {"endpointing": 500.0, "asr": -100.0, "llm_ttft": 190.0, "phrase": 200.0, "tts": 400.0,
                      "send": 10.0, "voice_to_voice": 1310.0}  # fmt: skip
    assert set(stages) == set(STAGES) - {"tool"}  # a turn that called no tool has no tool stage


def test_over_budget_lists_stages_past_their_budget_in_stage_order() -> None:
    t = full_trace({"voice_to_voice": 1000, "tts": 400, "endpointing": 499.9, "llm_ttft": 250})
    assert t.over_budget() == ["endpointing", "voice_to_voice"]  # tts at exactly its budget is not over


def test_first_mark_wins_and_unknown_marks_are_refused() -> None:
    t = TurnTrace(1)
    t.mark("llm_first_token", 5 * MS)
    t.mark("llm_first_token", 9 * MS)
    assert t.marks_ns["llm_first_token"] == 5 * MS
    with pytest.raises(ValueError):
        t.mark("llm_last_token")


def test_message_body_is_relative_to_the_first_mark_in_mark_order() -> None:
    t = full_trace({"voice_to_voice": 1800})
    t.info["ahead"] = {"saved_ms": 120.0}
    body = t.to_dict()
    assert body["turn_id"] == 7 and body["session_id"] == "sess"
    assert list(body["marks_ms"]) == [m for m in MARKS if m not in ("interrupted", "tool_start", "tool_done")]
    assert body["marks_ms"]["speech_start"] == 0.0 and body["marks_ms"]["done"] == 5000.0
    assert body["budgets_ms"] == {"voice_to_voice": 1800.0} and body["over_budget"] == []
    assert body["ahead"] == {"saved_ms": 120.0}
    assert not TurnTrace(2).finished and full_trace({}).finished


def test_a_partial_trace_has_only_the_stages_whose_marks_exist() -> None:
    t = TurnTrace(3)
    t.mark("llm_start", 0)
    t.mark("llm_first_token", 250 * MS)
    assert t.stages_ms() == {"llm_ttft": 250.0}
    assert t.over_budget() == []
