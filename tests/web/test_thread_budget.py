"""parley.thread_budget: threads of each CPU stage sized together from the cores (pure arithmetic)."""
from __future__ import annotations

from parley.thread_budget import ThreadBudget


def test_two_cores_keep_a_worker_for_what_users_wait_for_one_thread_a_recognition_two_a_synthesis() -> None:
    b = ThreadBudget.for_cores(2)
    assert (b.engine, b.stage_workers, b.asr, b.tts, b.small) == (2, 3, 1, 2, 1)
    assert ThreadBudget.for_cores(2, stage_workers=5).stage_workers == 5


def test_the_engine_team_takes_the_cores_running_stage_jobs_leave_and_never_none() -> None:
    two, sixteen = ThreadBudget.for_cores(2), ThreadBudget.for_cores(16)
    assert [two.engine_team(n) for n in (0, 1, 2, 3)] == [2, 1, 1, 1]
    assert [sixteen.engine_team(n) for n in (0, 1, 3, 8, 9)] == [16, 14, 10, 1, 1]
    assert ThreadBudget.for_cores(1).engine_team(0) == 1 and ThreadBudget.for_cores(0).engine_team(2) == 1
