"""Fixtures for the benchmark tests: the desktop client's in-process mock server, and one real `parley serve` on
the embedded models per session."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_CLIENT_TESTS = str(ROOT / "tests" / "client")  # client_mock_server (the desktop client's mock)
if _CLIENT_TESTS not in sys.path:
    sys.path.insert(0, _CLIENT_TESTS)

from bench._server import ServerProcess, start_server  # noqa: E402


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`parley serve` with the shipped config on a free port (about 20 s to load and warm the models)."""
    root = tmp_path_factory.mktemp("bench-server")
    server = start_server(root / "traces.jsonl", root / "server.log")
    yield server
    server.stop()
