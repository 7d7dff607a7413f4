"""Scheduler policy: which queued request gets a slot next and which running request takes the next step.

Pure bookkeeping over request ids (FIFO admission, round-robin steps); it knows nothing about models,
tensors or threads, so continuous batching can replace it by returning several ids per step.
"""
from __future__ import annotations

from collections import deque


class RoundRobinScheduler:
    def __init__(self) -> None:
        self._queued: deque[int] = deque()
        self._running: list[int] = []
        self._cursor = 0

    def enqueue(self, job_id: int) -> None:
        self._queued.append(job_id)

    def queued(self) -> list[int]:
        """In arrival order: admission is first come, first served."""
        return list(self._queued)

    def running(self) -> list[int]:
        return list(self._running)

    def start(self, job_id: int) -> None:
        self._queued.remove(job_id)
        self._running.append(job_id)

    def remove(self, job_id: int) -> None:
        if job_id in self._queued:
            self._queued.remove(job_id)
        elif job_id in self._running:
            i = self._running.index(job_id)
            self._running.pop(i)
            if i < self._cursor:
                self._cursor -= 1

    def next_step(self) -> int | None:
        """The running request that takes the next unit of work (one prefill or one decode step)."""
        if not self._running:
            return None
        self._cursor %= len(self._running)
        job = self._running[self._cursor]
        self._cursor += 1
        return job
