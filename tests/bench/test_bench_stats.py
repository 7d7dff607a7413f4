"""The benchmarks' arithmetic: percentiles, per-stage summaries against budgets, the chart's waterfall."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench._chart import draw, waterfall
from bench._client import TurnResult
from bench._stats import CLIENT_V2V, holds_budget, percentile, slowest_stage, stage_rows, summarize, violations

BUDGETS = {"asr": 300.0, "voice_to_voice": 1000.0}


def turn(i: int, v2v: float, asr: float, client: float | None, over: list[str] | None = None) -> TurnResult:
    trace = {"stages_ms": {"asr": asr, "voice_to_voice": v2v}, "over_budget": over or [], "budgets_ms": BUDGETS,
             "marks_ms": {"speech_end": 100.0, "endpoint": 600.0, "asr_final": 550.0, "llm_first_token": 700.0,
                          "first_phrase": 900.0, "tts_first_audio": 1000.0, "first_audio_sent": 1001.0}}
    return TurnResult(0, i, "set a timer", "piper", i + 1, "set a timer", "okay", client, trace)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(1, 101))), 95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_counts_turns_over_each_budget_and_the_client_clock_uses_the_v2v_budget() -> None:
    turns = [turn(0, 800, -20, 850), turn(1, 1200, 350, 1300, ["asr", "voice_to_voice"]), turn(2, 900, 100, None)]
    s = summarize(turns, BUDGETS)
    assert s["voice_to_voice"] == {"n": 3, "budget": 1000.0, "median": 900.0, "p95": pytest.approx(1170.0),
                                   "max": 1200.0, "over": 1}
    assert s["asr"]["median"] == 100.0 and s["asr"]["over"] == 1
    assert s[CLIENT_V2V]["n"] == 2 and s[CLIENT_V2V]["budget"] == 1000.0 and s[CLIENT_V2V]["over"] == 1
    assert s["llm_ttft"] == {"n": 0, "budget": None}
    assert violations(turns) == {"asr": 1, "voice_to_voice": 1}
    assert not holds_budget(s["voice_to_voice"]) and holds_budget({"n": 2, "budget": 10, "p95": 10})
    assert [r[0] for r in stage_rows(s)] == ["asr", "voice_to_voice", CLIENT_V2V]
    assert slowest_stage(s) == "asr"  # the only pipeline stage with values; the total never counts
    assert slowest_stage({}) is None


def test_waterfall_starts_at_speech_end_and_clamps_marks_that_came_early() -> None:
    marks = turn(0, 0, 0, None).trace["marks_ms"]  # type: ignore[index]
    segs = waterfall(marks)
    assert [s for s, _, _ in segs] == ["endpointing", "asr", "llm_ttft", "phrase", "tts", "send"]
    assert segs[0] == ("endpointing", 0.0, 500.0)
    assert segs[1] == ("asr", 500.0, 0.0)  # the final came before the endpoint: zero width, not negative
    assert segs[-1][1] + segs[-1][2] == 901.0  # ends at first_audio_sent - speech_end
    assert waterfall({"endpoint": 5.0}) == []


def test_chart_is_a_png(tmp_path: Path) -> None:
    turns = [turn(0, 800, -20, 850), turn(1, 1200, 350, 1300)]
    path = draw(turns, summarize(turns, BUDGETS), BUDGETS, tmp_path / "e2e.png", "test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
