"""Fixtures for the desktop client's tests: the scripted mock server, speech-like audio, waiting."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from client_mock_server import MockState, port_of, start_mock


def speechlike(seconds: float, rate: int = 16000, level: float = 0.15, seed: int = 1) -> np.ndarray:
    """Syllable-rate modulated noise: voiced enough for any energy detector, no model needed."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * np.arange(n) / rate)
    return (rng.standard_normal(n) * level * envelope).astype(np.float32)


async def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def mock() -> AsyncIterator[tuple[MockState, int]]:
    state = MockState()
    server = await start_mock(state)
    try:
        yield state, port_of(server)
    finally:
        server.close()
        await server.wait_closed()
