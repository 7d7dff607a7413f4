"""A benchmark's server: a `parley serve` started for it (bench/parley_process.py) or one given by URL; samples its
CPU and memory, and describes the machine. Knows nothing of the protocol.
"""
from __future__ import annotations

import argparse
import os
import platform
import threading
from pathlib import Path
from urllib.parse import urlsplit

from bench.parley_process import ROOT, ParleyProcess


def start_server(trace_log: Path, log_path: Path, *, config: str | None = None, sets: tuple[str, ...] = (),
                 port: int = 0, timeout_s: float = 180.0, command: str = "serve") -> ParleyProcess:
    """`parley serve` (or `parley stages`) on 127.0.0.1 (port 0: any free one) writing its turn traces to
    `trace_log`; returns once it is listening."""
    sets = (f"server.trace_log={trace_log}", *sets)
    return ParleyProcess(log_path, command=command, config=config, sets=sets, port=port).start(timeout_s)


class ResourceSampler:
    """CPU % (100 = one core) and peak RSS of one process (or several, summed) between `start()` and `stop()`."""

    def __init__(self, pid: int | list[int] | None, interval_s: float = 0.5) -> None:
        self.pids = [] if pid is None else [pid] if isinstance(pid, int) else list(pid)
        self.interval_s = interval_s
        self.cpu: list[float] = []
        self.rss_mb: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.pids:
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float | None]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        mean = sum(self.cpu) / len(self.cpu) if self.cpu else None
        return {"cpu_pct_mean": mean, "cpu_pct_max": max(self.cpu, default=None),
                "rss_mb_max": max(self.rss_mb, default=None)}

    def _run(self) -> None:
        import psutil

        try:
            procs = [psutil.Process(pid) for pid in self.pids]
            for proc in procs:
                proc.cpu_percent(None)
            while not self._stop.wait(self.interval_s):
                self.cpu.append(sum(proc.cpu_percent(None) for proc in procs))
                self.rss_mb.append(sum(proc.memory_info().rss for proc in procs) / 2**20)
        except psutil.NoSuchProcess:
            return


def machine() -> dict[str, object]:
    """What the numbers ran on: CPU model, cores, memory, load average at the time."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        import psutil

        mem_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_gib, "python": platform.python_version(),
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The flags both benchmarks share: which server to talk to, or how to start one."""
    p.add_argument("--server", help="URL of a running server (default: start `parley serve` on a free port)")
    p.add_argument("--token", help="the server's token, if it needs one")
    p.add_argument("--config", help="config file for the started server (default configs/default.yaml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the started server (repeatable)")
    p.add_argument("--persona", help="persona to talk to (default: the server's)")


def open_server(args: argparse.Namespace, out: Path, extra_sets: tuple[str, ...] = ()) -> tuple[str, ParleyProcess | None, int | None]:
    """(url, the started process or None, the server's pid for sampling or None) for `--server` or a fresh one."""
    if args.server:
        return args.server, None, pid_listening(urlsplit(args.server if "://" in args.server else "//" + args.server).port)
    logs = ROOT / "artifacts" / "bench"  # git-ignored, wherever the results go
    logs.mkdir(parents=True, exist_ok=True)
    server = start_server(logs / f"{out.stem}.traces.jsonl", logs / f"{out.stem}.server.log", config=args.config,
                          sets=(*extra_sets, *args.sets))
    print(f"started parley serve at {server.url} (log {server.log_path})", flush=True)
    return server.url, server, server.proc.pid


def pid_listening(port: int | None) -> int | None:
    """The local process listening on `port`, so a server started by hand can be sampled too."""
    import psutil

    if port is None:
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except psutil.AccessDenied:
        return None
    return None
