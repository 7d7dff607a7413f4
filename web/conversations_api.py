"""The conversations a server keeps (parley.conversation_db, storage.url): listed, read back as transcripts and
forgotten on request. Behind the same Guard as every route (the server's token); the page that shows them is
static/conversations.html. Reads may wait on the database, so they run off the event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from web.state import AppState, ConversationInUse

log = logging.getLogger(__name__)


def mount(app: FastAPI, state: AppState) -> None:
    store = state.conversations.store

    @app.exception_handler(_Unavailable)
    async def unavailable(request: Request, exc: _Unavailable) -> JSONResponse:
        return _error(503, "store_unavailable", str(exc))

    async def read(what: str, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except Exception as exc:  # a database that is down: said, not a 500 with a stack
            log.error("conversation store: %s failed: %r", what, exc)
            raise _Unavailable(f"the conversation store did not answer ({exc.__class__.__name__})") from None

    @app.get("/api/conversations")
    async def conversations(limit: int = 50) -> JSONResponse:
        listed = await read("listing", store.listing, max(1, min(limit, 500)))
        rows = [{**dataclasses.asdict(c), "open": state.conversations.get(c.id) is not None} for c in listed]
        return JSONResponse({"conversations": rows})

    @app.get("/api/conversations/{conversation_id}")
    async def conversation(conversation_id: str) -> JSONResponse:
        said = await read("transcript", store.transcript, conversation_id)
        if said is None:
            return _error(404, "not_found", f"no conversation {conversation_id!r} is kept here")
        turns = await read("turns", store.turns, conversation_id)
        open_ = state.conversations.get(conversation_id)
        return JSONResponse({"id": conversation_id, "open": open_ is not None,
                             "messages": [{"role": role, "content": text} for role, text in said],
                             "turns": [dataclasses.asdict(t) for t in turns]})  # fmt: skip

    @app.delete("/api/conversations/{conversation_id}")
    async def forget(conversation_id: str) -> JSONResponse:
        said = await read("transcript", store.transcript, conversation_id)
        if said is None and state.conversations.get(conversation_id) is None:
            return _error(404, "not_found", f"no conversation {conversation_id!r} is kept here")
        try:
            await state.forget_conversation(conversation_id)
        except ConversationInUse as exc:
            return _error(409, "in_use", str(exc))
        return JSONResponse({"deleted": conversation_id})


class _Unavailable(Exception):
    pass


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
