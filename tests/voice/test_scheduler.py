"""The scheduler's async shell over real worker threads: order, skipped partials, cancellation, errors, waits.
Jobs are gated by events, never by sleeps; the clock is a fake one the test moves."""
from __future__ import annotations

import asyncio
import threading

import pytest

from voice.scheduler import DirectRunner, Skipped, StageScheduler
from voice.stage_queue import Policy, Priority


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def _until(predicate, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_jobs_run_by_priority_and_report_their_wait() -> None:
    clock = Clock()
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1), clock=clock)
    gate, ran = threading.Event(), []
    try:
        blocker = asyncio.ensure_future(sched.run("asr", Priority.WAITED, "x", gate.wait))
        await _until(lambda: sched.stats.running == 1, "the blocker to run")
        partial = asyncio.ensure_future(sched.run("asr", Priority.PARTIAL, "a", ran.append, "partial"))
        phrase = asyncio.ensure_future(sched.run("tts", Priority.NEXT, "b", ran.append, "phrase"))
        final = asyncio.ensure_future(sched.run("asr", Priority.WAITED, "c", ran.append, "final"))
        await _until(lambda: sum(sched.stats.depth.values()) == 3 or len(ran) > 0, "three queued jobs")
        clock.t = 0.25  # 250 ms pass on the scheduler's clock while they queue
        gate.set()
        await asyncio.gather(blocker, partial, phrase, final)
        assert ran == ["final", "phrase", "partial"]
        assert final.result().wait_ms == pytest.approx(250.0)
        assert sched.stats.count[("asr", "waited")] == 2 and sched.stats.count[("asr", "partial")] == 1
    finally:
        gate.set()
        sched.close()


async def test_a_stale_partial_is_skipped_and_a_replaced_one_too() -> None:
    clock = Clock()
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1, partial_max_wait_ms=500), clock=clock)
    gate = threading.Event()
    try:
        blocker = asyncio.ensure_future(sched.run("asr", Priority.WAITED, "x", gate.wait))
        await _until(lambda: sched.stats.running == 1, "the blocker to run")
        first = asyncio.ensure_future(sched.run("asr", Priority.PARTIAL, "a", lambda: "first"))
        await _until(lambda: sched.stats.depth.get("partial") == 1, "a queued partial")
        second = asyncio.ensure_future(sched.run("asr", Priority.PARTIAL, "a", lambda: "second"))
        with pytest.raises(Skipped):
            await first  # replaced by its session's newer partial
        clock.t = 0.6
        gate.set()
        await blocker
        with pytest.raises(Skipped):
            await second  # queued 600 ms > 500 ms: stale
        assert sched.stats.skipped == {("asr", "replaced"): 1, ("asr", "stale"): 1}
    finally:
        gate.set()
        sched.close()


async def test_cancelling_a_queued_job_takes_it_out_and_errors_reach_the_caller() -> None:
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1))
    gate, ran = threading.Event(), []
    try:
        blocker = asyncio.ensure_future(sched.run("asr", Priority.WAITED, "x", gate.wait))
        await _until(lambda: sched.stats.running == 1, "the blocker to run")
        queued = asyncio.ensure_future(sched.run("tts", Priority.WAITED, "a", ran.append, "cancelled"))
        await _until(lambda: sched.stats.depth.get("waited") == 1, "a queued job")
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued

        def boom() -> None:
            raise ValueError("bad audio")

        failing = asyncio.ensure_future(sched.run("asr", Priority.WAITED, "b", boom))
        gate.set()
        await blocker
        with pytest.raises(ValueError, match="bad audio"):
            await failing
        assert ran == []
        assert (await sched.run("asr", Priority.WAITED, "c", lambda: 7)).value == 7  # the worker lives on
    finally:
        gate.set()
        sched.close()


async def test_closed_scheduler_refuses_and_direct_runner_runs_at_once() -> None:
    sched = StageScheduler(Policy.for_workers(2))
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        await sched.run("asr", Priority.WAITED, "a", lambda: 1)
    ran = await DirectRunner().run("asr", Priority.PARTIAL, "a", lambda x: x + 1, 1)
    assert (ran.value, ran.wait_ms) == (2, 0.0)


async def test_finals_queued_together_run_as_one_batch() -> None:
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1))
    gate, batches = threading.Event(), []

    def batch(audios: list[str]) -> list[str]:
        batches.append(list(audios))
        return [a.upper() for a in audios]

    try:
        blocker = asyncio.ensure_future(sched.run("tts", Priority.WAITED, "x", gate.wait))
        await _until(lambda: sched.stats.running == 1, "the blocker to run")
        finals = [asyncio.ensure_future(sched.run("asr", Priority.WAITED, k, str.upper, k, batch=batch)) for k in "abc"]
        await _until(lambda: sched.stats.depth.get("waited") == 3, "three queued finals")
        gate.set()
        await blocker
        assert [f.value for f in await asyncio.gather(*finals)] == ["A", "B", "C"]
        assert batches == [["a", "b", "c"]]
        assert sched.stats.batched["asr"] == 3
        alone = await sched.run("asr", Priority.WAITED, "d", str.upper, "d", batch=batch)
        assert alone.value == "D" and len(batches) == 1  # one job alone runs as itself
    finally:
        gate.set()
        sched.close()


async def test_optional_work_is_no_sessions_committed_load() -> None:
    # Partials and the preemptive phrase are shed while the machine is busy: their time counts where time went
    # (stage_busy_s, /metrics), not in the session's load that admission weighs (busy_s). Later phrases count.
    sched = StageScheduler(Policy(workers=1, partial_workers=1, background_workers=1))
    spin = lambda: sum(range(200_000))  # noqa: E731 - a little real work
    try:
        # a job's result reaches its caller a moment before the worker books its time: wait for the booking
        await sched.run("asr", Priority.PARTIAL, "s", spin)
        await sched.run("tts", Priority.AHEAD, "s", spin)
        await _until(lambda: {"asr", "tts"} <= sched.stage_busy_s.keys() and sched.stats.running == 0, "the booking")
        assert sched.busy_s.get("s", 0.0) == 0.0 and min(sched.stage_busy_s.values()) > 0
        optional = dict(sched.stage_busy_s)
        await sched.run("asr", Priority.WAITED, "s", spin)
        await sched.run("tts", Priority.NEXT, "s", spin)
        await _until(lambda: all(sched.stage_busy_s[k] > v for k, v in optional.items()), "both bookings")
        committed = sum(sched.stage_busy_s.values()) - sum(optional.values())
        assert committed > 0 and sched.busy_s["s"] == pytest.approx(committed)  # the final and the later phrase
    finally:
        sched.close()


async def test_each_worker_runs_a_chore_once_and_then_takes_jobs_again() -> None:
    """on_each_worker (runtime.warm: per-thread first-run costs paid at load): every worker thread runs it, once,
    the call returns when all have, an error in it comes back to the caller, and jobs run afterwards as before."""
    sched = StageScheduler(Policy(workers=3, partial_workers=1, background_workers=1), name="w")
    try:
        ran: list[str] = []
        lock = threading.Lock()

        def chore() -> None:
            with lock:
                ran.append(threading.current_thread().name)

        await asyncio.to_thread(sched.on_each_worker, chore)
        assert sorted(ran) == ["w-0", "w-1", "w-2"]

        def broken() -> None:
            raise ValueError("no model")

        with pytest.raises(ValueError, match="no model"):
            await asyncio.to_thread(sched.on_each_worker, broken)
        assert (await sched.run("asr", Priority.WAITED, "k", lambda: 7)).value == 7
        DirectRunner().on_each_worker(broken)  # no threads of its own to warm: nothing runs
    finally:
        sched.close()
