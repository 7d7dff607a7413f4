"""`parley serve`: load and warm the models, bind uvicorn, print the URL once it is listening.

Model problems are one clear line and exit code 1, before any port is bound.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time

import uvicorn

from web import runtime as rt
from web.app import create_app
from web.config import AppConfig
from web.locate import ModelNotFound


def serve(cfg: AppConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print("Parley: loading models ...", flush=True)
    t0 = time.perf_counter()
    try:
        runtime = rt.load_and_warm(cfg)
    except ModelNotFound as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as exc:  # a backend that cannot start (missing flite, bad model file)
        print(f"parley: cannot load models: {exc}", file=sys.stderr)
        return 1
    loads = ", ".join(f"{k} {v:.1f} s" for k, v in runtime.load_s.items())
    print(f"Parley: models ready in {time.perf_counter() - t0:.1f} s ({loads})", flush=True)

    app = create_app(cfg, runtime=runtime)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.server.host,
            port=cfg.server.port,
            ws_max_size=cfg.server.max_message_bytes,  # larger messages are closed with 1009 by the protocol layer
            log_level="warning",
            lifespan="on",
        )
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
        print(f"Parley is listening on http://{host}:{port}", flush=True)
    await task
    return 0 if server.started else 1
