"""`parley serve`: load and warm the models, bind uvicorn, print the URL once it is listening; on SIGTERM, drain.

Model problems are one clear line and exit code 1, before any port is bound. SIGTERM stops accepting, lets the
replies being spoken finish (up to server.shutdown_grace_s), tells each client (`server_shutdown`), closes the
sessions (their traces reach the log) and exits 0.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

from parley import heap
from parley import runtime as rt
from parley.config import AppConfig
from parley.locate import ModelNotFound
from web.app import create_app
from web.transport import RepeatFilter, guarded_h11, raise_fd_limit
from web.ws import drain

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn's server; a first SIGTERM drains before the usual shutdown (a second, or SIGINT, stops at once)."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._draining or self._loop is None:
            return super().handle_exit(sig, frame)
        self._draining = True
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain_then_exit()))

    async def _drain_then_exit(self) -> None:
        log.info("SIGTERM: draining (no new connections; running replies may finish)")
        for server in self.servers:
            server.close()
        try:
            await self._drain()
        finally:
            self.should_exit = True


def serve(cfg: AppConfig, *, stages_only: bool = False) -> int:
    """stages_only (`parley stages`): the OpenAI-compatible routes alone (web.openai_api), no voice sessions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("asyncio", "uvicorn.error"):  # accept failures and bad requests can come thousands a second
        logging.getLogger(noisy).addFilter(RepeatFilter())
    print("Parley: loading models ...", flush=True)
    t0 = time.perf_counter()
    try:
        runtime = rt.load_and_warm(cfg, cfg.server.stages if stages_only else rt.ALL_STAGES, sessions=not stages_only)
    except ModelNotFound as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as exc:  # a backend that cannot start (missing flite, bad model file)
        print(f"parley: cannot load models: {exc}", file=sys.stderr)
        return 1
    loads = ", ".join(f"{k} {v:.1f} s" for k, v in runtime.load_s.items())
    print(f"Parley: models ready in {time.perf_counter() - t0:.1f} s ({loads})", flush=True)

    if stages_only:
        from web.openai_api.app import create_stages_app

        app = create_stages_app(cfg, runtime=runtime)
    else:
        app = create_app(cfg, runtime=runtime)
    frozen = heap.freeze_loaded()  # the loaded models' objects out of every later collection (parley.heap)
    logging.getLogger("parley").info("froze %d objects out of later garbage collections", frozen)
    s = cfg.server
    fds = raise_fd_limit()
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=s.host,
            port=s.port,
            http=guarded_h11(s.header_timeout_s, min(s.max_connections, max(16, fds - 64)), s.max_header_bytes),
            timeout_keep_alive=5,
            ws_max_size=s.max_message_bytes,  # larger messages are closed with 1009 by the protocol layer
            log_level="warning",
            lifespan="on",
        ),
        # HTTP requests in flight are waited for by uvicorn's own shutdown
        drain=(lambda: asyncio.sleep(0)) if stages_only else (lambda: drain(app.state.parley, s.shutdown_grace_s)),
    )
    try:
        return asyncio.run(_run(server, cfg.server.host))
    finally:
        runtime.close()


async def _run(server: uvicorn.Server, host: str) -> int:
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]  # the real port when the config says 0
        print(f"Parley is listening on http://{host}:{port}", flush=True)  # the tests and the bench read this line
    await task
    return 0 if server.started else 1
