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


def head_bytes(request: h11.Request) -> int:
    """The size of a request's head as sent: request line and header lines with their CRLFs, and the blank line."""
    line = len(request.method) + len(request.target) + len(b"HTTP/") + len(request.http_version) + 4
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items()) + 2


class _HeadLimited(h11.Connection):
    """h11's connection, refusing a request whose head (request line and headers) is over `max_head_bytes` even when
    it arrived whole: h11's own bound only counts a head still incomplete, so one read of 100 KB went through."""

    def __init__(self, *args: Any, max_head_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, max_incomplete_event_size=max_head_bytes, **kwargs)
        self.max_head_bytes = max_head_bytes
        self.refused_status: int | None = None  # the status the last protocol error asked for (431: head too large)

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused_status = exc.error_status_hint
            raise
        if isinstance(event, h11.Request) and head_bytes(event) > self.max_head_bytes:
            self.refused_status = 431
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        return event


def guarded_h11(header_timeout_s: float, max_connections: int, max_header_bytes: int = 65536) -> type[H11Protocol]:
    """uvicorn's h11 protocol, refusing connections past `max_connections` at once, closing one whose request
    headers are not all in within `header_timeout_s` of its start (or of its previous response), and answering a
    request whose head is over `max_header_bytes` with 431 (however it arrived, however many headers make it)."""

    class GuardedH11(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _HeadLimited(h11.SERVER, max_head_bytes=max_header_bytes)

        def send_400_response(self, msg: str) -> None:
            status = self.conn.refused_status or 400
            if status == 400:
                return super().send_400_response(msg)
            # the head was read (or abandoned) whole: answer, then close; nothing else of this connection is read
            body = b"request header fields too large\n"
            head = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"), (b"content-length", b"%d" % len(body))]
            for event in (h11.Response(status_code=status, headers=head, reason=b"Request Header Fields Too Large"),
                          h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event))
            self.transport.close()

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
