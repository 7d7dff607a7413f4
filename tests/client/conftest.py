"""Fixtures for the desktop client's tests: the scripted mock server."""
from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.mock_server import MockState, port_of, start_mock


@pytest.fixture
async def mock() -> AsyncIterator[tuple[MockState, int]]:
    state = MockState()
    server = await start_mock(state)
    try:
        yield state, port_of(server)
    finally:
        server.close()
        await server.wait_closed()
