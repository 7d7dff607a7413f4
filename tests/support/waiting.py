"""Waiting for something to happen, never for a length of time: a test that sleeps and then asserts passes when
the thing it checks comes late. The timeout only bounds a test that would otherwise hang."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll `cond` on the event loop (every 20 ms) until it holds; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)
