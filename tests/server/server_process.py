"""`parley serve` as a separate process on loopback, for tests that need a real server process (signals, file
descriptors, raw TCP). The config is the shipped one with test limits (tests/server/server_config.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from server_config import write_test_config

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    def __init__(self, root: Path, *, command: str = "serve", env: dict[str, str] | None = None,
                 more: dict[str, Any] | None = None, **server: Any) -> None:  # fmt: skip
        """command: `serve`, or `stages` (the OpenAI-compatible stage server); `more`: see write_test_config."""
        self.root = root
        self.command = command
        self.env = env or {}
        root.mkdir(parents=True, exist_ok=True)
        self.config = write_test_config(root, more=more, **server)
        self.log_path = root / "server.log"
        self.trace_log = root / "traces.jsonl"
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.lines: list[str] = []

    def start(self, timeout_s: float = 180.0) -> "ServerProcess":
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen([sys.executable, "-m", "parley.cli", "--config", str(self.config), self.command], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        found = threading.Event()
        threading.Thread(target=self._copy, args=(self.proc.stdout, found), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"parley {self.command} did not start:\n" + "".join(self.lines[-40:]))
        return self

    def _copy(self, stream: IO[str] | None, found: threading.Event) -> None:
        assert stream is not None
        with open(self.log_path, "w") as log:
            for line in stream:
                self.lines.append(line)
                log.write(line)
                log.flush()
                if line.startswith("Parley is listening on "):
                    self.url = line.split()[-1].strip()
                    found.set()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def ws_url(self, token: str | None) -> str:
        return f"ws://127.0.0.1:{self.port}/ws" + (f"?token={token}" if token else "")

    def terminate(self) -> int:
        """SIGTERM, then wait for the process to end by itself. -> its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def rss_mb(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb / 1024.0
