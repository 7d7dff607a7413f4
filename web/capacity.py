"""Admission from committed work: each session's measured load (its share of the engine's steps, a batched step
split among the sessions in it, plus the worker time of its recognition, checks and synthesis; a moving average)
summed, plus what a newcomer is expected to cost, against the cores. Optional work (partials, the preemptive phrase)
is not counted: it is shed while the machine is busy (voice.scheduler).

Pure: the caller hands in each session's cumulative busy core-seconds, the process's CPU seconds and the time; no
clock, no I/O. Busy time is wall time of a job or an engine step, which a shared core stretches (a job waiting for a
core is not working); the process's own CPU time is what the sessions really used, so the sum of the sessions' loads
is scaled down to it when it is the smaller (never up). A session
not yet measured counts as a heavy one (`session_cores`, from bench/load.py's measured sessions per core), so a
burst of arrivals cannot overshoot before anything is known; a measured one counts as what it really costs, so
listeners and readers leave room that talkers would not. A newcomer is expected to cost what the measured sessions
here cost on average (never more than a heavy one): among users who mostly listen, a new one is priced as one of them.

The engine is priced apart as well: it is one serial resource (a step's thread team only spreads that step), so a
model whose steps cost more fills it long before the cores are (the 0.5B default under churn: the engine busy all
the time, replies 22 s late, while the sessions' core loads still left room). Each session's share of the engine's
wall time, averaged the same way, summed with a newcomer's against `engine_share` of it; a session not measured yet
counts as a heavy one's part of the engine: what a talking session's turns cost this engine, timed at start
(parley.runtime.calibrate_engine: a burst of arrivals on a slow model or CPU is priced as that, not as the 135M on a
fast machine), else the same part of it as a heavy one's of the cores.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Refusal:
    reason: str
    retry_after_ms: int


@dataclass
class LoadMeter:
    """Per session: cores kept busy, an exponential moving average over `tau_s` of its busy time's growth."""

    tau_s: float = 10.0
    min_age_s: float = 2.0  # measured for less than this: not known yet (counts as heavy)
    _seen: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)  # key -> (first_s, busy_s, at_s, cores)
    scale: float = 1.0  # the last observation's wall-to-CPU correction (<= 1), for the log and the tests

    def observe(self, busy_s: Mapping[str, float], now_s: float, cpu_s: float | None = None) -> dict[str, float | None]:
        """busy_s: each live session's cumulative busy core-seconds; cpu_s: the process's cumulative CPU seconds (None:
        not known). -> each session's load in cores (None: not known yet). Sessions missing from `busy_s` are forgotten."""
        loads: dict[str, float | None] = {key: self._average(key, busy, now_s) for key, busy in busy_s.items()}
        for key in [k for k in self._seen if k not in busy_s and k != _PROCESS]:
            del self._seen[key]
        self.scale = 1.0
        used = None if cpu_s is None else self._average(_PROCESS, cpu_s, now_s)
        measured = sum(v for v in loads.values() if v is not None)
        if used is not None and measured > used:
            self.scale = used / measured
            loads = {k: None if v is None else v * self.scale for k, v in loads.items()}
        return loads

    def _average(self, key: str, busy: float, now_s: float) -> float | None:
        first, last_busy, at, cores = self._seen.get(key, (now_s, busy, now_s, 0.0))
        dt = now_s - at
        if dt > 0:
            weight = 1.0 - math.exp(-dt / self.tau_s)
            cores += weight * (max(0.0, busy - last_busy) / dt - cores)
            last_busy, at = busy, now_s
        self._seen[key] = (first, last_busy, at, cores)
        # before tau_s has passed the average is still warming from zero: scale it up to what it has seen
        age = now_s - first
        return None if age < self.min_age_s else cores / (1.0 - math.exp(-age / self.tau_s))


_PROCESS = "\0process"  # the meter's key for the process's CPU time (no session id looks like it)


@dataclass(frozen=True)
class CostModel:
    cores: float  # what committed work may fill
    session_cores: float  # a not yet measured session's load, and a newcomer's at most: a heavy one
    tau_s: float = 10.0  # the meter's averaging time: how fast a finished talker's load fades
    engine_share: float = 0.0  # of the engine's wall time, what committed steps may fill (0: not priced apart)
    # a talking session's share of the engine's wall time as measured at start on this machine and model (None: not
    # measured; then the same part of what the engine may fill as a heavy session's of the cores)
    heavy_engine: float | None = None

    @property
    def session_engine(self) -> float:
        """A heavy session's share of the engine: as calibrated at start where it was, else the same part of what the
        engine may fill as of the cores."""
        if self.heavy_engine is not None:
            return self.heavy_engine
        return self.engine_share * self.session_cores / self.cores if self.cores > 0 else self.engine_share

    def committed(self, loads: Mapping[str, float | None]) -> float:
        return _committed(loads, self.session_cores)

    def committed_engine(self, engine: Mapping[str, float | None]) -> float:
        return _committed(engine, self.session_engine)

    def newcomer(self, loads: Mapping[str, float | None]) -> float:
        """What one more session is expected to cost: what the measured sessions here cost on average (users who
        mostly listen leave room for more of their kind), never more than a heavy one; a heavy one while none is
        measured."""
        return _newcomer(loads, self.session_cores)

    def refusal(self, loads: Mapping[str, float | None],
                engine: Mapping[str, float | None] | None = None) -> Refusal | None:  # fmt: skip
        """Why one more session would push committed work past the cores or the engine's share (and when to try
        again), or None. `engine`: each session's share of the engine's wall time (None: not measured yet)."""
        if not loads:
            return None  # an empty server always takes one
        over = self._over(loads, self.cores, self.session_cores)
        if over is not None:
            committed, newcomer, retry_ms = over
            return Refusal(
                f"the {len(loads)} sessions here keep {committed:.2f} of {self.cores:g} cores busy; another "
                f"(~{newcomer:.2f}) would pass what the cores can do", retry_ms)  # fmt: skip
        if engine and self.engine_share > 0:
            over = self._over(engine, self.engine_share, self.session_engine)
            if over is not None:
                committed, newcomer, retry_ms = over
                return Refusal(
                    f"the {len(engine)} sessions here keep the language model busy {committed:.0%} of the time; "
                    f"another (~{newcomer:.0%}) would pass the {self.engine_share:.0%} it can give and keep replies "
                    "in time", retry_ms)  # fmt: skip
        return None

    def _over(self, loads: Mapping[str, float | None], capacity: float,
              heavy: float) -> tuple[float, float, int] | None:  # fmt: skip
        """(committed, a newcomer's price, when to retry in ms) when one more would pass `capacity`, else None."""
        committed, newcomer = _committed(loads, heavy), _newcomer(loads, heavy)
        if committed + newcomer <= capacity + 1e-9:
            return None
        # if the excess stopped now, the average would fall below the room a newcomer needs after about:
        room = max(capacity - newcomer, 1e-3)
        retry_s = self.tau_s * math.log(max(committed / room, 1.0 + 1e-3))
        return committed, newcomer, int(min(max(1000.0, 1000.0 * retry_s), 60_000.0))


def _committed(loads: Mapping[str, float | None], heavy: float) -> float:
    return sum(heavy if load is None else load for load in loads.values())


def _newcomer(loads: Mapping[str, float | None], heavy: float) -> float:
    measured = [load for load in loads.values() if load is not None]
    return min(heavy, sum(measured) / len(measured)) if measured else heavy
