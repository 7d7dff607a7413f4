"""POST /v1/chat/completions and GET /v1/models over the loaded engine: streamed (SSE) or whole.

A request names its conversation with `user` or the X-Parley-Session header: its cache is kept in that
conversation's slot between requests. Without one it is anonymous and finds a continued conversation's cache
by prefix (GenerateRequest.share_prefix). A client that goes away mid-stream cancels the generation: the slot
is free within one decode step.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from voice.llm_bridge import LlmCall, LlmError, LlmFinish, LlmToken
from web.openai_api.schema import ApiError, ChatRequest, require_stage
from web.otel.requests import annotate_chat
from parley.runtime import Runtime

SESSION_HEADER = "x-parley-session"
DEFAULT_MAX_TOKENS = 512
_FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def engine_request(body: ChatRequest, session: str | None, max_seq_len: int) -> GenerateRequest:
    body.check_supported()
    wanted = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if wanted == 0:
        raise ApiError(400, "max_tokens: must be at least 1", param="max_tokens")
    messages = tuple(ChatMessage("system" if m.role == "developer" else m.role, m.text()) for m in body.messages)
    sampling = SamplingParams(
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stops(),
        max_new_tokens=min(wanted or DEFAULT_MAX_TOKENS, max_seq_len // 2),
    )  # fmt: skip
    if session:
        return GenerateRequest(f"http:{session}", messages, sampling)
    return GenerateRequest(f"anon:{uuid.uuid4().hex}", messages, sampling, share_prefix=True)


def _usage(fin: LlmFinish) -> dict[str, int]:
    prompt = fin.prefill_tokens + fin.reused_tokens
    return {"prompt_tokens": prompt, "completion_tokens": fin.generated_tokens,
            "total_tokens": prompt + fin.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": fin.reused_tokens}}  # fmt: skip


def router(runtime: Callable[[], Runtime], model_ids: dict[str, str], served: Collection[str]) -> APIRouter:
    """model_ids: what GET /v1/models lists, {id: kind}. Any model name is accepted: one LLM is served.
    served: the stages this process serves (chat completions need `llm`)."""
    api = APIRouter()

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [{"id": i, "object": "model", "created": 0, "owned_by": f"parley ({kind})"} for i, kind in model_ids.items()]
        return {"object": "list", "data": data}

    @api.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> JSONResponse | StreamingResponse:
        require_stage(served, "llm")
        engine = runtime().engine
        if engine is None:
            raise ApiError(501, "this server's LLM is itself remote (models.llm.backend: openai)", type="server_error")
        session = body.user or request.headers.get(SESSION_HEADER)
        req = engine_request(body, session, engine.max_seq_len)
        call = LlmCall(engine, req)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model or next(iter(model_ids))}
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_sse(call, head, usage), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache", "x-accel-buffering": "no"})  # fmt: skip
        parts: list[str] = []
        async with aclosing(call):
            async for event in call:
                if isinstance(event, LlmToken):
                    parts.append(event.text)
                elif isinstance(event, LlmError):
                    raise ApiError(500, f"generation failed: {event.message}", type="server_error")
                else:
                    fin = event
        annotate_chat(head["model"], fin)
        if fin.reason == "context" and fin.generated_tokens == 0:
            raise ApiError(400, f"messages: the last message alone is longer than the context ({engine.max_seq_len} "
                           "tokens, less room for the reply)", param="messages", code="context_length_exceeded")  # fmt: skip
        message = {"role": "assistant", "content": "".join(parts)}
        choice = {"index": 0, "message": message, "finish_reason": _FINISH[fin.reason], "logprobs": None}
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": _usage(fin)})

    return api


async def _sse(call: LlmCall, head: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
    """Chunks as OpenAI streams them: the role, content deltas, the finish reason, the usage, then [DONE]."""

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **more: Any) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        body = {**head, "object": "chat.completion.chunk", "choices": choices, **more}
        if include_usage and "usage" not in more:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    async with aclosing(call):  # the client went away (this generator is closed): the generation is cancelled
        yield chunk({"role": "assistant", "content": ""})
        async for event in call:
            if isinstance(event, LlmToken):
                if event.text:
                    yield chunk({"content": event.text})
            elif isinstance(event, LlmError):  # headers are sent: the error goes in the stream, as OpenAI's does
                err = {"message": f"generation failed: {event.message}", "type": "server_error", "param": None, "code": None}
                yield f"data: {json.dumps({'error': err})}\n\n"
                return
            else:
                annotate_chat(head["model"], event)
                yield chunk({}, _FINISH[event.reason])
                if include_usage:
                    yield chunk(None, usage=_usage(event))
    yield "data: [DONE]\n\n"
