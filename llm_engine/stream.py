"""The caller's side of a request (EngineStream) and the messages callers put in the engine thread's inbox.

Thread-safe by construction: callers only set events and post messages; the engine thread does the rest.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from llm_engine.request import ErrorEvent, Event, FinishEvent, TokenEvent

WAKE = "wake"  # an inbox message that only wakes the engine thread (a cancel is seen at its next step)


@dataclass(frozen=True)
class Release:
    """The session ended: cancel its requests and free its slot."""

    session_id: str


@dataclass(frozen=True)
class Hold:
    """Pause (or resume) one request's steps."""

    job_id: int
    on: bool


class EngineStream:
    """The caller's handle on one request: iterate events (blocking) or cancel."""

    def __init__(self, job_id: int, post: Callable[[object], None]) -> None:
        """`post`: puts a message in the engine thread's inbox (and so wakes it)."""
        self._post = post
        self.job_id = job_id
        self._events: queue.Queue[Event] = queue.Queue()
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self._events.get()
            yield ev
            if isinstance(ev, (FinishEvent, ErrorEvent)):
                return

    def cancel(self) -> None:
        """Checked before every unit of work, so it takes effect within one decode step."""
        self.cancelled.set()
        self._post(WAKE)

    def hold(self, on: bool = True) -> None:
        """Pause (or resume) this request's steps; it keeps its slot and its place (BatchScheduler.hold)."""
        self._post(Hold(self.job_id, on))

    def collect(self) -> tuple[list[int], str, Event]:
        """Convenience: drain the stream -> (token ids, text, the final Finish/Error event)."""
        ids, parts, last = [], [], None
        for ev in self:
            if isinstance(ev, TokenEvent):
                ids.append(ev.token_id)
                parts.append(ev.text)
            last = ev
        assert last is not None
        return ids, "".join(parts), last
