"""The FastAPI application: lifespan loads and warms every model once; routes /ws, /v1/realtime, /healthz, /api/personas,
/api/traces, /metrics and the browser client's static files. Knows config and runtime, not session internals.
"""
from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.requests import Request
from starlette.responses import Response
from fastapi.staticfiles import StaticFiles

from voice.stages import SessionSettings, Stages
from parley import heap
from parley import runtime as rt
from parley.config import AppConfig
from parley.conversation_db import SqlStore, open_store
from voice.conversation import Conversations
from parley.tool_offer import NOT_LOADED, llm_tool_support
from web.conversations_api import mount as mount_conversations
from web.guard import Guard
from web.metrics import Metrics, busy_counters, scheduler_exposition, stage_counters
from web.otel.export import Telemetry, llm_facts
from web.otel.requests import RequestSpans
from web.realtime.endpoint import handle_realtime
from web.state import AppState
from web.twilio import handle_twilio
from web.twilio_voice import voice_webhook
from web.ws import handle

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).resolve().parent / "static"
# coroutines a session's tasks run: any of these alive after a disconnect is a leak (the /healthz count)
_SESSION_CODE = ("Session.", "Listener.", "Reply.", "Replies.", "Connection.", "RealtimeConnection.", "LlmBridge.",
                 "TwilioCall.")


def _session_tasks() -> int:
    n = 0
    for task in asyncio.all_tasks():
        name = getattr(task.get_coro(), "__qualname__", "")
        if name.startswith(_SESSION_CODE):
            n += 1
    return n


def _check_stages(settings: SessionSettings, stages: Stages) -> None:
    """Refuse to serve with stages that no session could use (found at start, not at the first connection)."""
    if settings.turns.uses_audio and stages.turn_model is None:
        raise RuntimeError(f"vad.turn_detection {settings.turns.detection!r} needs the turn model, and none was loaded")


def create_app(
    cfg: AppConfig,
    *,
    runtime: rt.Runtime | None = None,
    load: Callable[[AppConfig], rt.Runtime] | None = None,
    settings: SessionSettings | None = None,
) -> FastAPI:
    """`runtime`: stages already loaded (serve() loads before binding); else `load(cfg)` (default: the real
    models, warmed) runs in the lifespan, off the event loop."""
    store = open_store(cfg.storage.url)
    state = AppState(
        cfg=cfg,
        conversations=Conversations(store),
        token_store=store if isinstance(store, SqlStore) else None,
        metrics=Metrics(cfg.server.trace_log),
        settings=settings or rt.session_settings(cfg),
        personas=rt.personas(cfg, llm_tool_support(runtime.stages.llm) if runtime is not None else NOT_LOADED),
        runtime=runtime,
        telemetry=Telemetry(cfg.observability, llm_facts(cfg)),
    )
    if runtime is not None:
        _check_stages(state.settings, runtime.stages)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.runtime is None:
            state.runtime = await asyncio.to_thread(load or rt.load_and_warm, cfg)
            _check_stages(state.settings, state.runtime.stages)
            state.personas = rt.personas(cfg, llm_tool_support(state.runtime.stages.llm))  # what tools: auto offers
        if isinstance(store, SqlStore):
            try:  # a database that is down is said at start; the server serves, and writes once it is up
                await asyncio.to_thread(store.ready)
            except Exception as exc:
                log.error("conversation store %s: %s (conversations are not saved until it answers)", store.shown_url, exc)
        try:
            yield
        finally:
            for session in list(state.sessions.values()):
                await session.close()
            state.runtime.close()
            await asyncio.to_thread(store.close)  # the conversations' last writes
            await asyncio.to_thread(state.telemetry.shutdown)  # sends what is queued, within one export timeout

    app = FastAPI(title="Parley", lifespan=lifespan)
    app.state.parley = state
    if cfg.server.openai_api:
        app.add_middleware(RequestSpans, telemetry=state.telemetry)  # spans of the stage routes (web.otel.requests)
    listens_on = () if cfg.server.host in ("0.0.0.0", "::", "") else (cfg.server.host,)
    app.add_middleware(Guard, hosts=(*listens_on, *cfg.server.allowed_hosts), token=cfg.server.token)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        loaded = state.runtime is not None
        body: dict[str, Any] = {
            "status": "ok" if loaded else "loading",
            "models_loaded": loaded,
            "connections": state.connections,
            "sessions": len(state.sessions),
            "session_tasks": _session_tasks(),
        }
        if state.runtime is not None:
            body["engine_slots"] = state.runtime.stages.llm.active_slots()
            body["tts_active"] = state.runtime.stages.tts_work.active
            body["load_s"] = {k: round(v, 2) for k, v in state.runtime.load_s.items()}
            body["llm_decode"] = state.runtime.stages.llm.decode_path  # which decode path, and why
            refusal = state.refusal()
            body["accepting"] = refusal is None
            body["refusing"] = refusal  # why a new session gets server_full now, or null
            body["capacity"] = state.admission().capacity or cfg.server.max_sessions
            body["queue_wait_p95_ms"] = state.runtime.stages.runner.recent_wait_ms()  # what users waited for, last 10 s
            body["v2v_p95_ms"] = state.metrics.recent_v2v_p95()  # the turns of the last 30 s
            if cfg.server.admit_cost_model:  # committed work in cores, of how many (web.capacity)
                cost = state.cost_model()
                body["committed_cores"] = round(cost.committed(state.session_loads()), 3)
                body["cores"] = cost.cores
                body["committed_engine"] = round(cost.committed_engine(state.engine_loads()), 3)  # of its wall time
                body["engine_share"] = cost.engine_share
            if state.runtime.threads is not None:
                body["threads"] = state.runtime.threads.__dict__
        return JSONResponse(body, status_code=200 if loaded else 503)

    @app.get("/api/personas")
    async def personas() -> dict[str, Any]:
        return {
            "default": cfg.default_persona,
            "personas": [
                {"name": p.name, "display_name": p.display_name, "voice": p.voice, "speaking_rate": p.speaking_rate,
                 "greeting": p.greeting, "max_reply_tokens": p.max_reply_tokens,
                 "tools": [t.spec.name for t in state.personas[p.name].tools], "tools_why": state.personas[p.name].tools_why}
                for p in cfg.persona_defs.values()
            ],  # fmt: skip
            "voices": [{"name": n, "backend": v.backend, "description": v.description} for n, v in cfg.voices.items()],
        }

    @app.get("/api/traces")
    async def traces(limit: int = 50) -> dict[str, Any]:
        return {"traces": state.metrics.traces(max(1, min(limit, 500)))}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        gauges: dict[str, float] = {}
        counters: dict[str, tuple[float, str]] = {}
        queue = ""
        if state.runtime is not None:
            gauges["parley_engine_active_slots"] = state.runtime.stages.llm.active_slots()
            gauges["parley_tts_active"] = state.runtime.stages.tts_work.active
            counters = stage_counters(state.runtime.stages.llm)
            counters.update(busy_counters(state.runtime))
            queue = scheduler_exposition(state.runtime.stages.runner.stats)
        counters.update(heap.pauses().counters())
        gauges["parley_gc_frozen_objects"] = gc.get_freeze_count()
        queue += state.telemetry.exposition()
        return PlainTextResponse(state.metrics.render(gauges, counters) + queue, media_type="text/plain; version=0.0.4")

    mount_conversations(app, state)  # GET/DELETE /api/conversations: the transcripts the store keeps

    if cfg.server.openai_api:
        from web.openai_api.app import mount

        mount(app, cfg, lambda: state.runtime)  # type: ignore[arg-type,return-value]  # loaded before serving

    @app.websocket("/ws")
    async def ws_endpoint(ws: WebSocket) -> None:
        await handle(ws, state)

    @app.websocket("/v1/realtime")
    async def realtime_endpoint(ws: WebSocket) -> None:
        await handle_realtime(ws, state)

    @app.post("/twilio/voice")
    async def twilio_voice(request: Request) -> Response:
        return await voice_webhook(request, cfg)

    @app.websocket("/twilio/stream")
    async def twilio_stream(ws: WebSocket) -> None:
        await handle_twilio(ws, state)

    webrtc_calls: set[asyncio.Task[None]] = set()

    @app.post("/webrtc/offer")
    async def webrtc_offer(request: Request) -> Response:
        from web.webrtc import offer  # aiortc loads at the first call (~0.5 s), not with every server

        return await offer(request, state, webrtc_calls)

    @app.get("/webrtc/config")
    async def webrtc_config() -> dict[str, Any]:
        from web.webrtc import ice_servers

        return {"ice_servers": ice_servers(cfg), "channel": "parley"}

    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static")
    return app
