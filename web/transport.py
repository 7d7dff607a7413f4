"""The HTTP server's own defences, under the app: a deadline on each request's headers, a cap on open connections,
the file-descriptor limit, and one log line for an error that repeats instead of a traceback each time.

uvicorn's h11 protocol, subclassed; it knows nothing of the app. (uvicorn alone kept 1,000 half-sent requests
open for as long as their clients liked, accepted 100 MB of headers, and logged a traceback for every failed
accept once the descriptors ran out: 1.6 GB of log in four minutes.)
"""
from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_h11(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, refusing connections past `max_connections` at once and closing one whose request
    headers are not all in within `header_timeout_s` of its start (or of its previous response)."""

    class GuardedH11(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()  # no task, no parser state: the descriptor is given back at once
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # a kept-alive connection's next request gets the same deadline

        def _arm(self) -> None:
            self.loop.call_later(header_timeout_s, self._headers_due)

        def _headers_due(self) -> None:
            # IDLE: the peer has not finished a request line and headers since the deadline was armed
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11


def raise_fd_limit() -> int:
    """The open-file soft limit raised to the hard limit (a server holds a descriptor per client); -> the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class RepeatFilter(logging.Filter):
    """Passes a log message the first time in each `window_s`, then one line saying how often it came meanwhile;
    the repeats carry no traceback (a flood of failed accepts logs one line a window, not one per event)."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[str, int], tuple[float, int]] = {}  # (message, level) -> (window start, repeats)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (str(record.msg), record.levelno)
        now = self._clock()
        start, repeats = self._seen.get(key, (-self.window_s, 0))
        if now - start < self.window_s:
            self._seen[key] = (start, repeats + 1)
            return False
        self._seen[key] = (now, 0)
        if len(self._seen) > 1000:  # many different messages: forget the old ones
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
        if repeats:
            record.msg = f"{record.msg} (and {repeats} more like it in the last {self.window_s:g} s)"
        return True
