"""A real PostgreSQL server for a test: Debian's binaries (scripts/setup.sh installs `postgresql`), a fresh cluster in a
temporary directory, run as the `postgres` user when the suite runs as root (PostgreSQL refuses root), on a free port,
stopped and removed at the end."""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """-> a SQLAlchemy URL of a running server's `postgres` database (user `tester`, trusted on loopback)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        raise FileNotFoundError("PostgreSQL's server is not installed: apt-get install postgresql")
    bindir = Path(bins[-1]).parent
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="parley-pg-"))
    os.chmod(root, 0o777)
    data, port = root / "data", _free_port()
    run = lambda *argv: subprocess.run([*as_pg, *map(str, argv)], check=True, capture_output=True, timeout=120)  # noqa: E731
    try:
        run(bindir / "initdb", "-D", data, "-A", "trust", "-U", "tester", "--no-sync")
        run(bindir / "pg_ctl", "-D", data, "-w", "-l", root / "log", "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")  # fmt: skip
        try:
            yield f"postgresql+psycopg://tester@127.0.0.1:{port}/postgres"
        finally:
            run(bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
