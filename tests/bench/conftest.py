"""Fixtures for the benchmark tests: one real `parley serve` on the embedded models per session."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench._server import start_server
from bench.parley_process import ParleyProcess


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ParleyProcess]:
    """`parley serve` with the shipped config on a free port (about 20 s to load and warm the models)."""
    root = tmp_path_factory.mktemp("bench-server")
    server = start_server(root / "traces.jsonl", root / "server.log")
    yield server
    server.stop()
