"""A uvicorn server for an app on a thread of its own, on an ephemeral 127.0.0.1 port, for the in-process tests."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_in_thread(app: Any, name: str, **config: Any) -> Iterator[int]:
    """Serve `app` until the block ends; yields the port."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **config))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.05)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
