"""Fixtures for the benchmark tests: one real `parley serve` on the embedded models per session."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench._server import start_server
from bench.parley_process import ParleyProcess


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ParleyProcess]:
    """`parley serve` with the shipped config on a free port (about 20 s to load and warm the models), the LLM the
    embedded SmolLM2-135M: these smoke tests check what the benchmarks measure and print, and its fast replies keep
    their time on two cores (the default model speaks in tests/browser and tests/llm_engine/test_default_model.py)."""
    root = tmp_path_factory.mktemp("bench-server")
    server = start_server(root / "traces.jsonl", root / "server.log", sets=("models.llm.source=embedded-135m",))
    yield server
    server.stop()
