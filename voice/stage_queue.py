"""Which shared-stage job runs next: priorities by what a user is waiting for (pure; no threads, no clock).

Recognition, speech synthesis and end-of-turn checks of every session share a few worker threads
(voice.scheduler). The order they run in decides who waits: a turn's final transcript, an end-of-turn check and
a reply's first phrase are what a user is waiting for right now; a reply's later phrases are needed before the
audio already queued runs out; a partial transcript is only a courtesy on the screen. So:

- strictly by priority, oldest first within one, except that an end-of-turn check (one thread, ~30 ms, and
  the endpoint waits on it) goes before the finals and first phrases waiting with it;
- partials and later phrases never take the last free worker (together at most `background_workers` run at
  once, partials alone at most `partial_workers`), so a final, a turn check or a first phrase never queues
  behind work nobody waits for that started before it;
- a partial starts only while at most `partial_beside` other jobs run (none on two cores): on a busy machine a
  partial does not take the cores from a final or a phrase that is running, it waits for a lull, and is dropped
  or replaced if none comes (bench/load.py, eight sessions on two cores: a request gets about three partial
  decodes of a growing window against one final; waiting for lulls took the v2v p95 from 1.4-2.4 s to
  1.2-1.4 s in most runs, as with no partials at all);
- a partial still queued after `partial_max_wait_ms` is dropped (by then the session has new audio and the
  next partial covers it), and a new partial from the same session replaces a queued one (coalesced): when
  the machine is behind, partials thin out instead of piling up;
- the preemptive first phrase (AHEAD: work for a turn not ended yet, thrown away if the user goes on) runs after
  everything else, as background work;
- a worker that starts a batchable job (a final transcript) takes the others of its kind queued behind it
  along (`take_like`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum


QUICK_STAGES = frozenset({"turn"})  # ~30 ms on one thread, and an endpoint waits on it: first among the waited jobs


class Priority(IntEnum):
    WAITED = 0  # a user waits on it now: a final transcript, an end-of-turn check, a reply's first phrase
    NEXT = 1  # a reply's later phrases
    PARTIAL = 2  # a partial transcript
    AHEAD = 3  # work for a turn not ended yet that may be thrown away: the preemptive first phrase (voice.first_phrase)


BACKGROUND = (Priority.NEXT, Priority.PARTIAL, Priority.AHEAD)  # never on the last free worker
OPTIONAL = (Priority.PARTIAL, Priority.AHEAD)  # shed while the machine is busy: nobody's committed load (web.capacity)


@dataclass(frozen=True)
class Job:
    id: int
    stage: str  # "asr", "tts", "turn": for the counters
    priority: Priority
    key: str  # who asked (a session id): a newer partial under the same key replaces a queued one
    submitted_ms: float


@dataclass(frozen=True)
class Policy:
    workers: int
    partial_workers: int  # partials that may run at once
    background_workers: int  # partials and later phrases together: below `workers`, so one worker stays free
    partial_max_wait_ms: float = 1000.0
    max_batch: int = 4  # jobs one worker runs as one batch, when the stage can
    partial_beside: int | None = None  # other jobs that may be running when a partial starts; None: any number

    @classmethod
    def for_workers(cls, workers: int, partial_max_wait_ms: float = 1000.0) -> "Policy":
        """One worker always free for what users wait for; partials get one worker, and half of them past four.
        The workers are sized from the cores (parley.thread_budget: cores / 2 + 1 jobs of two threads): a partial
        starts only while its two threads still fit beside the jobs running, none of them on two cores."""
        if workers < 1:
            raise ValueError(f"a scheduler needs at least one worker, not {workers}")
        return cls(workers, max(1, workers // 2 - 1), max(1, workers - 1), partial_max_wait_ms,
                   partial_beside=max(0, workers - 3))  # fmt: skip


@dataclass(frozen=True)
class Started:
    job: Job | None  # the job a free worker runs now; None: nothing may start
    dropped: tuple[Job, ...] = ()  # partials dropped as stale on the way


@dataclass
class StageQueue:
    policy: Policy
    _queues: dict[Priority, deque[Job]] = field(default_factory=lambda: {p: deque() for p in Priority})
    _partial_of: dict[str, Job] = field(default_factory=dict)  # key -> its queued partial
    running: dict[int, Job] = field(default_factory=dict)

    def submit(self, job: Job) -> Job | None:
        """Queue `job`; -> the queued partial it replaces (same key), to be answered as skipped."""
        replaced = None
        if job.priority is Priority.PARTIAL:
            replaced = self._partial_of.pop(job.key, None)
            if replaced is not None:
                self._queues[Priority.PARTIAL].remove(replaced)
            self._partial_of[job.key] = job
        self._queues[job.priority].append(job)
        return replaced

    def cancel(self, job: Job) -> bool:
        """Take a queued job out (its caller gave up); False when it is running or gone."""
        queue = self._queues[job.priority]
        if job not in queue:
            return False
        queue.remove(job)
        if self._partial_of.get(job.key) is job:
            del self._partial_of[job.key]
        return True

    def start(self, now_ms: float) -> Started:
        """The job a free worker should run now, and the stale partials dropped meanwhile."""
        dropped = self._drop_stale(now_ms)
        if len(self.running) >= self.policy.workers:
            return Started(None, dropped)
        for priority in Priority:
            queue = self._queues[priority]
            if not queue:
                continue
            if priority is not Priority.WAITED and self._running(*BACKGROUND) >= self.policy.background_workers:
                break
            if priority is Priority.PARTIAL and (
                self._running(Priority.PARTIAL) >= self.policy.partial_workers
                or (self.policy.partial_beside is not None
                    and self._running(Priority.WAITED, Priority.NEXT) > self.policy.partial_beside)
            ):  # fmt: skip
                break
            job = next((j for j in queue if j.stage in QUICK_STAGES), queue[0]) if priority is Priority.WAITED else queue[0]
            queue.remove(job)
            if priority is Priority.PARTIAL:
                del self._partial_of[job.key]
            self.running[job.id] = job
            return Started(job, dropped)
        return Started(None, dropped)

    def take_like(self, job: Job, limit: int) -> tuple[Job, ...]:
        """Up to `limit` queued jobs of `job`'s stage and priority (oldest first), started with it as one
        batch on its worker (recognition batches several sessions' finals: cheaper than one at a time)."""
        if job.priority is Priority.PARTIAL or limit <= 0:
            return ()
        queue = self._queues[job.priority]
        taken = tuple(j for j in queue if j.stage == job.stage)[:limit]
        for j in taken:
            queue.remove(j)
            self.running[j.id] = j
        return taken

    def finish(self, job: Job) -> None:
        self.running.pop(job.id, None)

    def depth(self) -> dict[Priority, int]:
        return {p: len(q) for p, q in self._queues.items()}

    def _running(self, *priorities: Priority) -> int:
        return sum(1 for j in self.running.values() if j.priority in priorities)

    def _drop_stale(self, now_ms: float) -> tuple[Job, ...]:
        queue = self._queues[Priority.PARTIAL]
        dropped = []
        while queue and now_ms - queue[0].submitted_ms > self.policy.partial_max_wait_ms:
            job = queue.popleft()
            del self._partial_of[job.key]
            dropped.append(job)
        return tuple(dropped)
