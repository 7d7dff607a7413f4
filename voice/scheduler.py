"""The shared-stage scheduler: a few worker threads run every session's recognition, synthesis and end-of-turn
checks in the order voice.stage_queue decides, and count how long each job waited.

`StageScheduler.run(stage, priority, key, fn, *args)` is awaited on the event loop; `fn(*args)` runs on a worker
thread; -> `Ran(value, wait_ms)`. With `batch` (fn over a list of first arguments -> a list of values), a worker
that takes the job also takes the queued ones of its stage and priority and runs them in one call. A partial the
queue drops raises `Skipped`. Cancelling the awaiting task takes a
queued job out; a running one finishes on its worker and its result is dropped.

`DirectRunner` is the scheduling Parley had before: every call on `asyncio.to_thread`, as many at once as
sessions ask for, no priorities (`server.scheduling: direct`, kept for the before/after comparison).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from voice.stage_queue import OPTIONAL, Job, Policy, Priority, StageQueue

T = TypeVar("T")

WAIT_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500)


class Skipped(Exception):
    """The scheduler dropped this partial: stale, or replaced by a newer one of the same session."""


@dataclass(frozen=True)
class Ran(Generic[T]):
    value: T
    wait_ms: float  # time queued before a worker took it


Batch = Callable[[list[Any]], list[Any]]


class StageRunner(Protocol):
    async def run(
        self, stage: str, priority: Priority, key: str, fn: Callable[..., T], *args: Any, batch: Batch | None = None
    ) -> Ran[T]: ...

    def recent_wait_ms(self) -> float | None: ...  # p95 wait of what users waited for, lately (admission)

    def forget_recent(self) -> None: ...

    def forget_key(self, key: str) -> None: ...  # a session ended: its busy time goes

    def on_each_worker(self, fn: Callable[[], None]) -> None: ...  # at load: per-thread first-call costs paid there

    def close(self) -> None: ...

    @property
    def stats(self) -> "WaitStats | None": ...  # waits and queue depths (None: no queue of its own)

    @property
    def busy_s(self) -> dict[str, float]: ...  # key (a session) -> worker-seconds its jobs took (admission)

    @property
    def stage_busy_s(self) -> dict[str, float]: ...  # stage -> worker-seconds in all (/metrics)


class DirectRunner:
    """No scheduling: each call on its own default-executor thread at once (the behaviour before the scheduler)."""

    stats = None

    def __init__(self) -> None:
        self.busy_s: dict[str, float] = {}  # (nothing is measured: always empty)
        self.stage_busy_s: dict[str, float] = {}

    def recent_wait_ms(self) -> float | None:
        return None

    def forget_recent(self) -> None:
        pass

    def forget_key(self, key: str) -> None:
        pass

    async def run(
        self, stage: str, priority: Priority, key: str, fn: Callable[..., T], *args: Any, batch: Batch | None = None
    ) -> Ran[T]:
        return Ran(await asyncio.to_thread(fn, *args), 0.0)

    def on_each_worker(self, fn: Callable[[], None]) -> None:
        pass  # its threads are the default executor's, made when needed: none to warm ahead

    def close(self) -> None:
        pass


@dataclass
class WaitStats:
    """Per (stage, priority): jobs run, their queue waits (sum and buckets); partials skipped; queue depth now."""

    count: Counter[tuple[str, str]] = field(default_factory=Counter)
    wait_sum_ms: Counter[tuple[str, str]] = field(default_factory=Counter)
    buckets: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # last: +Inf
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)  # (stage, reason)
    batched: Counter[str] = field(default_factory=Counter)  # stage -> jobs that ran in a batch of two or more
    depth: dict[str, int] = field(default_factory=dict)
    running: int = 0
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=500))  # (start ms, wait ms): waited jobs

    def observe(self, job: Job, wait_ms: float, now_ms: float = 0.0) -> None:
        if job.priority is Priority.WAITED:
            self.recent.append((now_ms, wait_ms))
        k = (job.stage, job.priority.name.lower())
        self.count[k] += 1
        self.wait_sum_ms[k] += wait_ms
        counts = self.buckets.setdefault(k, [0] * (len(WAIT_BUCKETS_MS) + 1))
        counts[next((i for i, b in enumerate(WAIT_BUCKETS_MS) if wait_ms <= b), len(WAIT_BUCKETS_MS))] += 1

    def recent_waited_p95(self, now_ms: float, window_ms: float = 10_000.0, min_jobs: int = 5) -> float | None:
        """p95 queue wait of what users waited for over the last `window_ms`; None with fewer than `min_jobs`."""
        waits = sorted(w for t, w in list(self.recent) if now_ms - t <= window_ms)
        if len(waits) < min_jobs:
            return None
        return waits[min(len(waits) - 1, int(0.95 * len(waits)))]


@dataclass
class _Entry:
    job: Job
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Ran[Any]]
    arg: Any = None  # the first argument, for a batch
    batch: Batch | None = None


class StageScheduler:
    def __init__(self, policy: Policy, *, clock: Callable[[], float] = time.monotonic, name: str = "stage") -> None:
        self.policy = policy
        self._clock = clock
        self._queue = StageQueue(policy)
        self._entries: dict[int, _Entry] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._closed = False
        self.stats = WaitStats()
        # key (a session) -> worker-seconds of its committed jobs (admission's cost model). Optional ones (partials,
        # the preemptive phrase: stage_queue.OPTIONAL) are shed while the machine is busy, so they count only in
        # stage_busy_s; later phrases count: replies stall when they cannot keep pace with playback.
        self.busy_s: dict[str, float] = {}
        self.stage_busy_s: dict[str, float] = {}  # stage -> worker-seconds in all (/metrics: where the time goes)
        self._chores: dict[int, Callable[[], None]] = {}  # worker thread id -> what it runs before its next job
        self._chore_errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(policy.workers)
        ]
        for t in self._threads:
            t.start()

    def _now_ms(self) -> float:
        return 1000.0 * self._clock()

    def recent_wait_ms(self) -> float | None:
        """p95 queue wait of what users waited for over the last 10 s (None: too few jobs to say)."""
        with self._cond:
            return self.stats.recent_waited_p95(self._now_ms())

    def forget_recent(self) -> None:
        with self._cond:
            self.stats.recent.clear()

    def forget_key(self, key: str) -> None:
        """The session ended: its busy time is no longer anyone's load."""
        with self._cond:
            self.busy_s.pop(key, None)

    async def run(
        self, stage: str, priority: Priority, key: str, fn: Callable[..., T], *args: Any, batch: Batch | None = None
    ) -> Ran[T]:
        future: concurrent.futures.Future[Ran[T]] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the stage scheduler is closed")
            job = Job(next(self._ids), stage, priority, key, self._now_ms())
            # the job runs in its caller's context (as asyncio.to_thread would): a remote stage's request then
            # carries the session's trace context (voice.remote.client.trace_headers)
            context = contextvars.copy_context()
            self._entries[job.id] = _Entry(job, lambda: context.run(fn, *args), future, args[0] if args else None, batch)
            replaced = self._queue.submit(job)
            if replaced is not None:
                self._skip(replaced, "replaced")
            self._note_depth()
            self._cond.notify()
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            with self._cond:
                if self._queue.cancel(job):
                    self._entries.pop(job.id, None)
                    self._note_depth()
            raise

    def on_each_worker(self, fn: Callable[[], None], timeout_s: float = 120.0) -> None:
        """Run `fn` once on every worker thread, before its next job; return when all have (the first error
        raised again). For first-call costs that are per thread: an ONNX session's first run on a thread took 20-30
        ms more than its later ones (Smart Turn, 2 cores), and without this the first user's first check paid it."""
        with self._cond:
            self._chores = {t.ident: fn for t in self._threads if t.ident is not None and t.is_alive()}
            self._chore_errors = []
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: not self._chores or self._closed, timeout=timeout_s):
                raise TimeoutError(f"the stage workers did not all run their chore within {timeout_s:g} s")
            if self._chore_errors:
                raise self._chore_errors[0]

    def close(self) -> None:
        """Stop the workers once their current jobs end; queued jobs fail with RuntimeError."""
        with self._cond:
            self._closed = True
            for entry in self._entries.values():
                if entry.future.set_running_or_notify_cancel():
                    entry.future.set_exception(RuntimeError("the stage scheduler closed"))
            self._entries.clear()
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5.0)

    def _skip(self, job: Job, reason: str) -> None:  # under the lock
        entry = self._entries.pop(job.id, None)
        self.stats.skipped[(job.stage, reason)] += 1
        if entry is not None and entry.future.set_running_or_notify_cancel():
            entry.future.set_exception(Skipped(f"{job.stage} {job.priority.name.lower()} {reason}"))

    def _next(self) -> list[_Entry]:
        """Under the lock: wait for a job this worker may run (with its batch); [] once closed or with a chore."""
        while not self._closed:
            if threading.get_ident() in self._chores:
                return []
            started = self._queue.start(self._now_ms())
            for job in started.dropped:
                self._skip(job, "stale")
            if started.job is not None:
                entry = self._entries.pop(started.job.id)
                if not entry.future.set_running_or_notify_cancel():
                    self._queue.finish(started.job)  # its caller gave up just now
                    continue
                entries = [entry]
                if entry.batch is not None:
                    for job in self._queue.take_like(started.job, self.policy.max_batch - 1):
                        other = self._entries.pop(job.id)
                        if other.batch == entry.batch and other.future.set_running_or_notify_cancel():
                            entries.append(other)
                        else:
                            self._queue.finish(job)
                            if not other.future.done():  # another kind of job under the same stage: back in line
                                self._entries[job.id] = other
                                self._queue.submit(job)
                self._note_depth()
                return entries
            self._note_depth()
            # a queued partial goes stale with time alone: wake up to drop it even when nothing else happens
            self._cond.wait(timeout=self.policy.partial_max_wait_ms / 1000.0 if any(self._queue.depth().values()) else None)
        return []

    def _note_depth(self) -> None:
        self.stats.depth = {p.name.lower(): n for p, n in self._queue.depth().items()}
        self.stats.running = len(self._queue.running)

    def _work(self) -> None:
        while True:
            with self._cond:
                entries = self._next()
                chore = None if entries else self._chores.get(threading.get_ident())
                if not entries and chore is None:
                    return
                now = self._now_ms()
                waits = [now - e.job.submitted_ms for e in entries]
                for e, wait_ms in zip(entries, waits):
                    self.stats.observe(e.job, wait_ms, now)
                if len(entries) > 1:
                    self.stats.batched[entries[0].job.stage] += len(entries)
            if chore is not None:
                self._run_chore(chore)
                continue
            started_s = time.perf_counter()
            try:
                self._run(entries, waits)
            finally:
                share_s = (time.perf_counter() - started_s) / len(entries)
                with self._cond:
                    for e in entries:
                        self._queue.finish(e.job)
                        if e.job.priority not in OPTIONAL:
                            self.busy_s[e.job.key] = self.busy_s.get(e.job.key, 0.0) + share_s
                        self.stage_busy_s[e.job.stage] = self.stage_busy_s.get(e.job.stage, 0.0) + share_s
                    self._note_depth()
                    self._cond.notify_all()

    def _run_chore(self, chore: Callable[[], None]) -> None:
        try:
            chore()
        except BaseException as exc:  # noqa: BLE001 - handed to on_each_worker's caller
            with self._cond:
                self._chore_errors.append(exc)
        finally:
            with self._cond:
                self._chores.pop(threading.get_ident(), None)
                self._cond.notify_all()

    @staticmethod
    def _run(entries: list[_Entry], waits: list[float]) -> None:
        try:
            if len(entries) == 1:
                values = [entries[0].fn()]
            else:
                assert entries[0].batch is not None
                values = entries[0].batch([e.arg for e in entries])
                if len(values) != len(entries):
                    raise RuntimeError(f"a batch of {len(entries)} gave {len(values)} results")
        except BaseException as exc:  # noqa: BLE001 - handed to every awaiting caller
            for e in entries:
                e.future.set_exception(exc)
            return
        for e, value, wait_ms in zip(entries, values, waits):
            e.future.set_result(Ran(value, wait_ms))
