"""Fixtures for the benchmark tests: the repo root on sys.path (bench/ is scripts, not an installed package),
the desktop client's in-process mock server, and one real `parley serve` on the embedded models per session."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT, ROOT / "tests" / "client"):  # bench.*; client_mock_server (the desktop client's mock)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench._server import ServerProcess, start_server  # noqa: E402


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`parley serve` with the shipped config on a free port (about 20 s to load and warm the models)."""
    root = tmp_path_factory.mktemp("bench-server")
    server = start_server(root / "traces.jsonl", root / "server.log")
    yield server
    server.stop()
