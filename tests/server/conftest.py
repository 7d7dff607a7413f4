"""A real Parley server on the embedded models, started once per test session in a thread on an ephemeral
127.0.0.1 port, plus a small websockets client. The config is a copy of the shipped one with test limits."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from parley import runtime as rt
from web.app import AppState, create_app
from in_thread import serve_in_thread
from server_config import TOKEN, write_test_config
from parley.config import AppConfig, load_config

@dataclass
class LiveServer:
    cfg: AppConfig
    state: AppState
    runtime: rt.Runtime
    port: int
    trace_log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, token: str | None = TOKEN) -> str:
        return f"ws://127.0.0.1:{self.port}/ws" + (f"?token={token}" if token else "")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("server")
    cfg = load_config(write_test_config(root))
    runtime = rt.load_and_warm(cfg)
    app = create_app(cfg, runtime=runtime)
    with serve_in_thread(app, "test-server", ws_max_size=cfg.server.max_message_bytes) as port:
        yield LiveServer(cfg, app.state.parley, runtime, port, root / "traces.jsonl")


@pytest.fixture(autouse=True)
def _live_server_idle(request: pytest.FixtureRequest) -> None:
    """Each test on the shared server starts with every slot free. A closed client's slot is held until
    the server has finished that session (usually milliseconds; one full CI run under load saw four held
    at once, and the next test's handshake was refused with 1013 server_full)."""
    if "live_server" not in request.fixturenames:
        return
    server: LiveServer = request.getfixturevalue("live_server")
    deadline = time.monotonic() + 60
    while server.state.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.state.connections == 0, f"{server.state.connections} connections still open 60 s after their tests"
    while server.state.resume.held() and time.monotonic() < deadline:  # a dropped client's conversation, held for a
        time.sleep(0.05)  # reconnect (server.resume_window_s: 5 here), keeps its engine slot until it expires
    assert not server.state.resume.held(), "conversations of dropped clients still held"
