"""A real `parley serve` (or `parley stages`) as a child process on 127.0.0.1, for the tests and the benchmarks:
its command line, its port, when it is ready (the "listening" line it prints once bound), its log, and stopping it
with everything it started (it leads its own process group). The one place that launches a real server."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"^Parley is listening on (http://\S+)")


class ParleyProcess:
    """`parley [--config FILE] --set ... <command> <args>`: `port` 0 takes a free one at the first start, and a restart
    comes back on the same; `sets` are config overrides; `env` is added to this process's environment."""

    def __init__(self, log_path: Path, *, command: str = "serve", args: Sequence[str] = (), config: str | Path | None = None,
                 sets: Sequence[str] = (), port: int = 0, env: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.log_path = log_path
        self.command = command
        self.args = tuple(args)
        self.config = config
        self.sets = tuple(sets)
        self.port = port
        self.env = dict(env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""  # http://127.0.0.1:PORT once listening
        self.lines: list[str] = []  # everything it printed, across restarts
        self.starts = 0
        self._reader: threading.Thread | None = None  # copies its output into the log and `lines`

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cli.main"]
        if self.config:
            argv += ["--config", str(self.config)]
        # its conversations in a database beside its log, not in the user's own data directory (unless its config
        # file or `sets` say where)
        own = self.config is not None or any(item.startswith("storage.") for item in self.sets) or self.command != "serve"
        store = () if own else (f"storage.url=sqlite:///{self.log_path.parent.resolve() / 'conversations.db'}",)
        for item in ("server.host=127.0.0.1", f"server.port={self.port}", *store, *self.sets):
            argv += ["--set", item]
        return [*argv, self.command, *self.args]

    def start(self, timeout_s: float = 240.0) -> Self:
        """Start it and return once it listens; RuntimeError with the end of its output if it exits or times out."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **self.env}
        self.url = ""
        self.starts += 1
        self.proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)  # fmt: skip
        listening = threading.Event()
        self._reader = threading.Thread(target=self._copy, args=(self.proc.stdout, listening), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not listening.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.kill()
                why = f"exited with {code}" if code is not None else f"was not listening after {timeout_s:.0f} s"
                raise RuntimeError(f"parley {self.command} {why}; its output ends:\n{self.log_tail()}")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def _copy(self, stream: IO[str] | None, listening: threading.Event) -> None:
        """Its output into the log (a new one at the first start, appended to at restarts) and `lines`; the URL
        from the listening line."""
        assert stream is not None
        with open(self.log_path, "w" if self.starts == 1 else "a") as log:
            for line in stream:
                self.lines.append(line)
                log.write(line)
                log.flush()
                m = LISTENING.match(line)
                if m and not listening.is_set():
                    self.url = m.group(1)
                    listening.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def ws_url(self, token: str | None = None, path: str = "/ws") -> str:
        return f"ws://127.0.0.1:{self.port}{path}" + (f"?token={token}" if token else "")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM to the server alone (it drains: the replies it is speaking may finish, their speech processes
        too), then wait for it to end by itself. -> its exit code."""
        assert self.proc is not None, "not started"
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server, and SIGKILL for whatever of its group is still there after `grace_s` or once it
        has ended (a speech process it left behind)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the process and its group at once (a crash, as far as its clients can tell)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=10)  # `lines` and the log hold the last it printed (why it ended, say)

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: its pid is its group's id
        except ProcessLookupError:
            pass  # the group is gone: the process ended and left nothing running

    def log_tail(self, n: int = 40) -> str:
        return "".join(self.lines[-n:])

    def rss_mb(self) -> float:
        """The server process's resident memory now."""
        with open(f"/proc/{self.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb / 1024.0
