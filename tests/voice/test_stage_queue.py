"""The shared-stage scheduling policy (voice.stage_queue) on scripted queues: no threads, no clock."""
from __future__ import annotations

import itertools

import pytest

from voice.stage_queue import Job, Policy, Priority, StageQueue

W, N, P = Priority.WAITED, Priority.NEXT, Priority.PARTIAL
_ids = itertools.count(1)


def job(priority: Priority, key: str = "s1", at: float = 0.0, stage: str = "asr") -> Job:
    return Job(next(_ids), stage, priority, key, at)


def started(q: StageQueue, now: float = 0.0) -> Job | None:
    return q.start(now).job


def test_policy_keeps_one_worker_for_what_users_wait_for() -> None:
    assert Policy.for_workers(3) == Policy(3, partial_workers=1, background_workers=2, partial_beside=0)
    assert Policy.for_workers(8) == Policy(8, partial_workers=3, background_workers=7, partial_beside=5)
    assert Policy.for_workers(1) == Policy(1, 1, 1, partial_beside=0)  # one worker: partials must still run sometime
    with pytest.raises(ValueError):
        Policy.for_workers(0)


def test_strict_priority_then_oldest_first() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1))
    partial, later, final_a, final_b = job(P, "a"), job(N, "b"), job(W, "c"), job(W, "d")
    for j in (partial, later, final_a, final_b):
        q.submit(j)
    order = []
    for _ in range(4):
        j = started(q)
        assert j is not None
        order.append(j)
        q.finish(j)
    assert order == [final_a, final_b, later, partial]
    assert started(q) is None


def test_a_final_never_waits_behind_a_partial_that_started_first() -> None:
    """Two workers: one partial runs, a second partial waits although a worker is free; a final takes that worker."""
    q = StageQueue(Policy(workers=2, partial_workers=1, background_workers=1))
    p1, p2 = job(P, "a"), job(P, "b")
    q.submit(p1)
    q.submit(p2)
    assert started(q) is p1
    assert started(q) is None  # p2 may not take the last free worker
    final = job(W, "c")
    q.submit(final)
    assert started(q) is final
    assert started(q) is None  # both workers busy
    q.finish(p1)
    assert started(q) is p2


def test_a_newer_partial_replaces_the_queued_one_of_its_session() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1))
    blocker = job(W, "x")
    q.submit(blocker)
    assert started(q) is blocker
    old = job(P, "a")
    assert q.submit(old) is None
    other = job(P, "b")
    q.submit(other)
    new = job(P, "a")
    assert q.submit(new) is old  # answered as skipped by the shell
    assert q.depth()[P] == 2
    q.finish(blocker)
    assert started(q) is other  # the replacement keeps its own place: behind b's, which came earlier
    q.finish(other)
    assert started(q) is new


def test_partials_queued_too_long_are_dropped_as_stale() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1, partial_max_wait_ms=500))
    busy = job(W, "x", at=0)
    q.submit(busy)
    assert started(q, 0) is busy
    stale, fresh = job(P, "a", at=0), job(P, "b", at=400)
    q.submit(stale)
    q.submit(fresh)
    out = q.start(600)  # the worker is still busy: nothing starts, the stale partial goes anyway
    assert out.job is None and out.dropped == (stale,)
    q.finish(busy)
    out = q.start(700)
    assert out.job is fresh and out.dropped == ()


def test_later_phrases_and_partials_together_leave_a_worker_free() -> None:
    q = StageQueue(Policy(workers=3, partial_workers=1, background_workers=2))
    phrase, partial, phrase2 = job(N, "a", stage="tts"), job(P, "b"), job(N, "c", stage="tts")
    for j in (phrase, partial, phrase2):
        q.submit(j)
    assert started(q) is phrase and started(q) is phrase2
    assert started(q) is None  # the third worker waits for what a user waits for
    check = job(W, "d", stage="turn")
    q.submit(check)
    assert started(q) is check
    q.finish(phrase)
    assert started(q) is partial


def test_finals_and_phrases_are_never_dropped_however_long_they_wait() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1, partial_max_wait_ms=10))
    busy, final, phrase = job(W, at=0), job(W, "b", at=0), job(N, "c", at=0)
    for j in (busy, final, phrase):
        q.submit(j)
    assert started(q, 0) is busy
    assert q.start(60_000).dropped == ()
    q.finish(busy)
    assert started(q, 60_000) is final


def test_cancel_takes_a_queued_job_out_but_not_a_running_one() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1))
    running, queued, partial = job(W, "a"), job(W, "b"), job(P, "c")
    for j in (running, queued, partial):
        q.submit(j)
    assert started(q) is running
    assert not q.cancel(running)
    assert q.cancel(queued) and q.cancel(partial)
    assert not q.cancel(queued)
    assert q.depth() == {W: 0, N: 0, P: 0, Priority.AHEAD: 0}
    q.submit(job(P, "c"))  # its session may queue a partial again
    assert q.depth()[P] == 1


def test_a_worker_takes_the_queued_finals_of_its_stage_as_one_batch() -> None:
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1))
    busy = job(W, "x", stage="tts")
    q.submit(busy)
    assert started(q) is busy
    finals = [job(W, k) for k in "abcde"]
    check, partial = job(W, "f", stage="turn"), job(P, "g")
    for j in (finals[0], check, *finals[1:], partial):
        q.submit(j)
    q.finish(busy)
    assert started(q) is check  # the turn check first (it is quick, and an endpoint waits on it)
    q.finish(check)
    first = started(q)
    assert first is finals[0]
    assert q.take_like(first, 3) == tuple(finals[1:4])  # same stage and priority, oldest first, up to the limit
    assert q.take_like(partial, 3) == ()  # partials are never batched
    for j in finals[:4]:
        q.finish(j)
    assert started(q) is finals[4]


def test_on_two_cores_a_partial_waits_for_a_lull_and_is_dropped_if_none_comes() -> None:
    """for_workers(3) (two cores): a partial does not start beside a running final or phrase, though a worker and
    its partial slot are free; it starts once they finish, and goes stale if they never leave a gap."""
    q = StageQueue(Policy.for_workers(3, partial_max_wait_ms=500))
    final, partial = job(W, "a"), job(P, "b", at=0.0)
    q.submit(final)
    q.submit(partial)
    assert started(q) is final
    assert started(q, 10) is None  # two workers free, no partial running: still waits, the final has the cores
    phrase = job(N, "c", stage="tts")
    q.submit(phrase)
    assert started(q, 20) is phrase  # later phrases are not held back
    q.finish(final)
    assert started(q, 30) is None  # the phrase still runs
    q.finish(phrase)
    assert started(q, 40) is partial  # a lull: the partial runs
    q.finish(partial)
    busy, late = job(W, "d"), job(P, "e", at=100.0)
    q.submit(busy)
    q.submit(late)
    assert started(q, 100) is busy
    out = q.start(700)  # the final is still running past partial_max_wait_ms
    assert out.job is None and out.dropped == (late,)


def test_an_end_of_turn_check_goes_before_the_finals_and_phrases_waiting_with_it() -> None:
    """Among the jobs users wait for, a turn check (one thread, ~30 ms, an endpoint waits on it) starts first;
    the rest keep their order, and a later phrase still waits for all of them."""
    q = StageQueue(Policy(workers=1, partial_workers=1, background_workers=1))
    later, final, phrase, check = job(N, "a", stage="tts"), job(W, "b"), job(W, "c", stage="tts"), job(W, "d", stage="turn")
    for j in (later, final, phrase, check):
        q.submit(j)
    order = []
    while (j := started(q)) is not None:
        order.append(j)
        q.finish(j)
    assert order == [check, final, phrase, later]
