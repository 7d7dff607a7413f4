"""`parley serve` (or `stages`) as a separate process on loopback with the test config (tests/server/server_config.py),
for tests that need a real server process (signals, file descriptors, raw TCP). bench/parley_process.py launches it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.parley_process import ParleyProcess
from server_config import write_test_config


class ServerProcess(ParleyProcess):
    def __init__(self, root: Path, *, command: str = "serve", env: dict[str, str] | None = None,
                 more: dict[str, Any] | None = None, port: int = 0, **server: Any) -> None:  # fmt: skip
        """command: `serve`, or `stages` (the OpenAI-compatible stage server); `more`, `server`: see write_test_config."""
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.trace_log = root / "traces.jsonl"  # where the test config sends the turn traces
        config = write_test_config(root, more=more, **server)
        super().__init__(root / "server.log", command=command, config=config, port=port, env=env)
