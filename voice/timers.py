"""A session's timers: `set_timer` (a tool) starts one; when it is due the session says its reminder aloud, even
while the user is silent. Timers are tasks of the session: they die with it.

The tool reaches its session's Timers through a context variable that voice.tool_turn sets around each call, so
the tool stays a plain `module:function` (docs/tools.md). Knows nothing of audio or the wire.
"""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

MAX_TIMER_S = 24 * 3600
MAX_TIMERS = 16  # at once, per session
FLOOR_POLL_S = 0.1  # a due timer waits this long between looks at whether the floor is free
MAX_FLOOR_WAIT_S = 30.0  # then it speaks anyway (a user who never stops talking still hears it)


@dataclass(frozen=True)
class Timer:
    id: int
    seconds: float
    label: str

    def reminder(self) -> str:
        return f"Your {self.label} timer is done." if self.label else "Your timer is done."


class Timers:
    """`spawn` runs a coroutine function as the session's background work; `floor_free()` says nobody is speaking
    (neither the user nor a reply); `announce(text)` starts a reply that says `text`."""

    def __init__(self, spawn: Callable[..., Any], floor_free: Callable[[], bool], announce: Callable[[str], None]) -> None:
        self._spawn, self._floor_free, self._announce = spawn, floor_free, announce
        self.pending: dict[int, Timer] = {}
        self.fired: list[Timer] = []
        self._next = 1

    def add(self, seconds: float, label: str = "") -> Timer:
        if not 0 < seconds <= MAX_TIMER_S:
            raise ValueError(f"a timer runs between 1 second and {MAX_TIMER_S // 3600} hours, not {seconds:g} s")
        if len(self.pending) >= MAX_TIMERS:
            raise ValueError(f"{MAX_TIMERS} timers are running already")
        timer = Timer(self._next, float(seconds), label.strip()[:60])
        self._next += 1
        self.pending[timer.id] = timer
        self._spawn(self._run, timer)
        return timer

    async def _run(self, timer: Timer) -> None:
        try:
            await asyncio.sleep(timer.seconds)
            waited_s = 0.0
            while not self._floor_free() and waited_s < MAX_FLOOR_WAIT_S:  # say it between turns, not over one
                await asyncio.sleep(FLOOR_POLL_S)
                waited_s += FLOOR_POLL_S
        finally:
            self.pending.pop(timer.id, None)
        self.fired.append(timer)
        self._announce(timer.reminder())


CURRENT: contextvars.ContextVar[Timers] = contextvars.ContextVar("parley_timers")


async def set_timer(seconds: int, label: str = "") -> str:
    """Start a timer that says when it is due.

    seconds: how long until it is due, in seconds (five minutes is 300)
    label: what the timer is for, e.g. tea; may be empty
    """
    timers = CURRENT.get(None)
    if timers is None:
        raise RuntimeError("timers run only inside a voice session")
    timer = timers.add(seconds, label)
    return f"timer {timer.id} set for {_spoken_duration(timer.seconds)}" + (f" ({timer.label})" if timer.label else "")


def _spoken_duration(seconds: float) -> str:
    s = int(round(seconds))
    parts = [(s // 3600, "hour"), (s % 3600 // 60, "minute"), (s % 60, "second")]
    return " ".join(f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n) or "0 seconds"


def bound(timers: Timers, run: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """`run` with CURRENT set to `timers` while it runs (a task's context is its own copy)."""

    async def inner() -> Any:
        CURRENT.set(timers)
        return await run()

    return inner
