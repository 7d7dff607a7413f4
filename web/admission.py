"""Admission control: whether the server can hold one more conversation within its budgets (pure).

Three limits, each with the reason a refused client is told (`server_full`) and /healthz shows:
- capacity from measurement: `server.sessions_per_core` x the cores, which bench/load.py measures (the most
  sessions whose voice-to-voice p95 holds its budget, per core); 0 turns it off;
- the conversations here not holding their budget now: the voice-to-voice p95 of the turns of the last 30 s is
  over `server.admit_v2v_ratio` x its budget;
- the machine falling behind now: the recent p95 of how long what users wait for (final transcripts, first
  phrases, turn checks) queued for a worker is over `server.admit_max_wait_ms`.
The last two only while anyone is connected: an empty server always takes a session.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    capacity: int  # 0: no limit from measurement
    max_wait_ms: float  # 0: no limit from queue waits
    max_v2v_ms: float = 0.0  # 0: no limit from recent turns

    @classmethod
    def from_config(cls, sessions_per_core: float, cores: int, max_sessions: int, max_wait_ms: float,
                    v2v_ratio: float = 0.0, v2v_budget_ms: float | None = None) -> "Admission":  # fmt: skip
        measured = max(1, min(math.floor(sessions_per_core * cores), max_sessions)) if sessions_per_core > 0 else 0
        max_v2v = v2v_ratio * v2v_budget_ms if v2v_ratio and v2v_budget_ms else 0.0
        return cls(measured, max_wait_ms, max_v2v)

    def refusal(self, sessions: int, recent_wait_ms: float | None, recent_v2v_ms: float | None = None) -> str | None:
        """Why one more session would not hold its budgets, or None to admit it."""
        if self.capacity and sessions >= self.capacity:
            return f"the server holds {self.capacity} conversations within their latency budgets and has {sessions}"
        if self.max_v2v_ms and sessions and recent_v2v_ms is not None and recent_v2v_ms > self.max_v2v_ms:
            return (f"the conversations here answer in {recent_v2v_ms:.0f} ms voice to voice (p95 of the last 30 s); "
                    f"another would push them further past {self.max_v2v_ms:.0f} ms")  # fmt: skip
        if self.max_wait_ms and sessions and recent_wait_ms is not None and recent_wait_ms > self.max_wait_ms:
            return (f"the server is behind: what users wait for queued {recent_wait_ms:.0f} ms for a worker "
                    f"(p95 of the last 10 s; the limit is {self.max_wait_ms:.0f} ms)")  # fmt: skip
        return None
