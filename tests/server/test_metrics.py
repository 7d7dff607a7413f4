"""Metrics: Prometheus exposition of turns, stage histograms, sessions and errors; the trace log."""
from __future__ import annotations

import json
from pathlib import Path

from web.metrics import Metrics


def trace(turn_id: int, v2v: float, interrupted: bool = False) -> dict:
    marks = {"speech_start": 0.0, "interrupted" if interrupted else "done": 10.0}
    return {"turn_id": turn_id, "session_id": "s", "marks_ms": marks, "stages_ms": {"voice_to_voice": v2v, "tts": 20.0},
            "budgets_ms": {"voice_to_voice": 1800.0}, "over_budget": ["voice_to_voice"] if v2v > 1800 else []}  # fmt: skip


def sample(text: str, name: str) -> float:
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_render_counts_turns_histograms_sessions_and_errors(tmp_path: Path) -> None:
    m = Metrics(tmp_path / "t.jsonl")
    m.session_opened()
    m.session_opened()
    m.session_closed()
    m.record_trace(trace(1, 40.0))
    m.record_trace(trace(2, 2500.0, interrupted=True))
    m.record_trace({"turn_id": 3, "session_id": "s", "marks_ms": {"speech_start": 0.0, "endpoint": 300.0}, "stages_ms": {},
                    "budgets_ms": {}, "over_budget": [], "no_words": True})  # a turn heard as no words: not answered
    m.error("bad_json")
    m.error("bad_json")
    text = m.render({"parley_tts_active": 0})
    assert sample(text, 'parley_turns_total{outcome="done"}') == 1
    assert sample(text, 'parley_turns_total{outcome="interrupted"}') == 1
    assert sample(text, 'parley_turns_total{outcome="no_words"}') == 1
    assert sample(text, 'parley_stage_latency_ms_bucket{stage="voice_to_voice",le="50"}') == 1
    assert sample(text, 'parley_stage_latency_ms_bucket{stage="voice_to_voice",le="2000"}') == 1
    assert sample(text, 'parley_stage_latency_ms_bucket{stage="voice_to_voice",le="3000"}') == 2
    assert sample(text, 'parley_stage_latency_ms_bucket{stage="voice_to_voice",le="+Inf"}') == 2
    assert sample(text, 'parley_stage_latency_ms_sum{stage="voice_to_voice"}') == 2540.0
    assert sample(text, 'parley_over_budget_total{stage="voice_to_voice"}') == 1
    assert sample(text, "parley_active_sessions") == 1 and sample(text, "parley_sessions_total") == 2
    assert sample(text, 'parley_errors_total{code="bad_json"}') == 2
    assert "# TYPE parley_stage_latency_ms histogram" in text and text.endswith("\n")
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["turn_id"] for t in lines] == [1, 2, 3]
    assert [t["turn_id"] for t in m.traces(1)] == [3]


def test_an_unwritable_trace_log_does_not_lose_the_trace(tmp_path: Path) -> None:
    m = Metrics(tmp_path / "missing-dir" / "t.jsonl")
    m.record_trace(trace(1, 40.0))
    assert m.traces() and m.turns["done"] == 1
