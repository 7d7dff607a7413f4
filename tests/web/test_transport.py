"""The connection-level guards that are not about one request: the file limit raised at start, and repeated log
lines (a flood of failed accepts) logged once a window with a count, without a traceback each."""
from __future__ import annotations

import logging
import resource
import sys

import pytest

from web.transport import RepeatFilter, raise_fd_limit


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        exc_info = sys.exc_info()
    return logging.LogRecord("asyncio", level, __file__, 1, msg, None, exc_info)


def test_a_repeated_line_passes_once_a_window_with_a_count() -> None:
    clock = Clock()
    f = RepeatFilter(window_s=10.0, clock=clock)
    assert f.filter(record("socket.accept() out of system resource"))
    passed = sum(f.filter(record("socket.accept() out of system resource")) for _ in range(500))
    assert passed == 0  # 500 failed accepts inside the window: no line, so no traceback either
    assert f.filter(record("another message"))  # a different message has its own window
    clock.t += 10.0
    again = record("socket.accept() out of system resource")
    assert f.filter(again)
    assert again.getMessage().endswith("(and 500 more like it in the last 10 s)")


def test_the_file_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 64:
        pytest.skip(f"hard limit {hard}: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        assert raise_fd_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 64), hard))
