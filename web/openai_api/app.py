"""The OpenAI-compatible routes on a FastAPI app: on their own (`parley stages`) or beside /ws (`parley serve`
with server.openai_api). Errors, including validation errors, come in OpenAI's shape.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from parley import runtime as rt
from parley.config import AppConfig
from web.guard import Guard
from web.metrics import Metrics, stage_counters
from web.openai_api import audio, chat
from web.openai_api.schema import ApiError
from web.otel.export import Telemetry, llm_facts
from web.otel.requests import RequestSpans

# OpenAI's speech voices: each speaks as server.openai_voices says, else as the default persona's voice
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")  # fmt: skip


def voice_aliases(cfg: AppConfig) -> dict[str, str]:
    default = cfg.persona(None).voice
    return {**{name: default for name in OPENAI_VOICES}, **cfg.server.openai_voices}


KIND = {"llm": "chat", "asr": "transcription", "tts": "speech"}  # a stage -> what /v1/models calls it


def model_ids(cfg: AppConfig, served: Collection[str] = rt.ALL_STAGES) -> dict[str, str]:
    """What /v1/models lists of the `served` stages: the LLM first (a chat request's default model name), then
    the recogniser, then the voices."""
    def name(source: str, fallback: str) -> str:
        return fallback if source.startswith("embedded") else Path(source).name

    m = cfg.models
    ids = {"llm": name(m.llm.source, "parley-llm"), "asr": name(m.asr.source, "parley-whisper"), "tts": "parley-tts"}
    return {ids[stage]: KIND[stage] for stage in ids if stage in served}


def _error(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def mount(app: FastAPI, cfg: AppConfig, runtime: Callable[[], rt.Runtime], served: Collection[str] = rt.ALL_STAGES) -> None:
    """served: the stages these routes answer for; a route of another stage says so (404, `stage_not_served`)."""
    app.include_router(chat.router(runtime, model_ids(cfg, served), served))
    app.include_router(audio.router(runtime, voice_aliases(cfg), served))

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _error(exc.status_code, exc.body)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        return _error(400, ApiError(400, message, param=param).body)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)


def create_stages_app(cfg: AppConfig, *, runtime: rt.Runtime | None = None,
                      load: Callable[[AppConfig], rt.Runtime] | None = None) -> FastAPI:  # fmt: skip
    """`parley stages`: the loaded stages behind the OpenAI-compatible routes, /healthz and /metrics; no /ws.
    A runtime handed in stays its caller's to close; one loaded here is closed with the app."""
    holder: dict[str, rt.Runtime] = {} if runtime is None else {"runtime": runtime}
    served = frozenset(cfg.server.stages)
    metrics = Metrics(None)
    telemetry = Telemetry(cfg.observability, llm_facts(cfg))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = "runtime" not in holder
        if owned:
            holder["runtime"] = await asyncio.to_thread(load or partial(rt.load_and_warm, stages=served, sessions=False), cfg)
        try:
            yield
        finally:
            if owned:
                holder["runtime"].close()
            await asyncio.to_thread(telemetry.shutdown)

    app = FastAPI(title="Parley stages", lifespan=lifespan)
    app.add_middleware(RequestSpans, telemetry=telemetry)  # inside the Guard: refused requests make no spans
    listens_on = () if cfg.server.host in ("0.0.0.0", "::", "") else (cfg.server.host,)
    app.add_middleware(Guard, hosts=(*listens_on, *cfg.server.allowed_hosts), token=cfg.server.token)

    def current() -> rt.Runtime:
        if "runtime" not in holder:
            raise ApiError(503, "models are loading", type="server_error")
        return holder["runtime"]

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        r = holder.get("runtime")
        body: dict[str, Any] = {"status": "ok" if r else "loading", "models_loaded": r is not None}
        if r is not None:
            body |= {"stages": sorted(r.served), "tts_active": r.stages.tts_work.active,
                     "load_s": {k: round(v, 2) for k, v in r.load_s.items()}}  # fmt: skip
            if "llm" in r.served:
                body |= {"engine_slots": r.stages.llm.active_slots(), "llm_decode": r.stages.llm.decode_path}
        return JSONResponse(body, status_code=200 if r else 503)

    @app.get("/metrics")
    async def metrics_route() -> PlainTextResponse:
        gauges: dict[str, float] = {}
        counters: dict[str, tuple[float, str]] = {}
        if (r := holder.get("runtime")) is not None:
            gauges = {"parley_tts_active": r.stages.tts_work.active}
            if "llm" in r.served:
                gauges["parley_engine_active_slots"] = r.stages.llm.active_slots()
                counters = stage_counters(r.stages.llm)
        return PlainTextResponse(metrics.render(gauges, counters) + telemetry.exposition(), media_type="text/plain; version=0.0.4")

    mount(app, cfg, current, served)
    return app
