"""Admission control (web.admission) as a pure rule, and the recent latencies it goes by (web.metrics)."""
from __future__ import annotations

from web.admission import Admission
from web.metrics import Metrics


def test_capacity_comes_from_sessions_per_core_and_never_exceeds_max_sessions() -> None:
    assert Admission.from_config(4, cores=2, max_sessions=16, max_wait_ms=400).capacity == 8
    assert Admission.from_config(4, cores=8, max_sessions=16, max_wait_ms=400).capacity == 16
    assert Admission.from_config(0.3, cores=2, max_sessions=16, max_wait_ms=400).capacity == 1  # at least one
    assert Admission.from_config(0, cores=2, max_sessions=16, max_wait_ms=400).capacity == 0  # off


def test_each_refusal_says_why() -> None:
    a = Admission.from_config(2, cores=2, max_sessions=16, max_wait_ms=400, v2v_ratio=1.5, v2v_budget_ms=900)
    assert a.max_v2v_ms == 1350
    assert a.refusal(3, None) is None
    assert "holds 4 conversations" in (a.refusal(4, None) or "")
    assert "1600 ms voice to voice" in (a.refusal(2, None, recent_v2v_ms=1600) or "")
    assert a.refusal(2, None, recent_v2v_ms=1300) is None
    assert "queued 500 ms" in (a.refusal(2, 500.0) or "")
    assert a.refusal(0, 5000.0, recent_v2v_ms=9000) is None  # an empty server always takes one: nobody to protect


def _trace(v2v: float) -> dict:
    return {"turn_id": 1, "marks_ms": {"done": 1.0}, "stages_ms": {"voice_to_voice": v2v}, "over_budget": []}


def test_recent_voice_to_voice_needs_a_few_turns_and_is_forgotten_when_everyone_left() -> None:
    m = Metrics()
    for v in (400, 500, 600):
        m.record_trace(_trace(v))
    assert m.recent_v2v_p95() is None  # three turns say too little
    m.record_trace(_trace(2000))
    assert m.recent_v2v_p95() == 2000
    m.forget_recent()
    assert m.recent_v2v_p95() is None
