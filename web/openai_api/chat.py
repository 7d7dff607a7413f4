"""POST /v1/chat/completions and GET /v1/models over the loaded engine or a remote LLM: streamed (SSE) or whole.

A request names its conversation with `user` or the X-Parley-Session header: its cache is kept in that
conversation's slot between requests. Without one it is anonymous and finds a continued conversation's cache
by prefix (GenerateRequest.share_prefix). A client that goes away mid-stream cancels the generation: the slot
is free within one decode step. Tools and response_format: web/openai_api/tools.py, docs/tools.md.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llm_engine import constrain
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from llm_engine.tool_format import ToolSpec
from voice.llm_bridge import LlmCall, LlmError, LlmFinish, LlmToken, ToolAsk
from web.openai_api import tools as wire_tools
from web.openai_api.schema import ApiError, ChatRequest, Message, require_stage
from web.otel.requests import annotate_chat
from parley.runtime import Runtime

SESSION_HEADER = "x-parley-session"
DEFAULT_MAX_TOKENS = 512
_FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def _checked(body: ChatRequest) -> tuple[int | None, tuple[ToolSpec, ...]]:
    """-> (max tokens asked for, the tools), or the 400 naming what is wrong."""
    body.check_supported()
    wanted = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if wanted == 0:
        raise ApiError(400, "max_tokens: must be at least 1", param="max_tokens")
    try:
        tools = wire_tools.tool_specs(body.tools)
    except ValueError as exc:
        raise ApiError(400, f"tools: {exc}", param="tools") from None
    return wanted, tools


def engine_request(body: ChatRequest, session: str | None, max_seq_len: int) -> GenerateRequest:
    wanted, tools = _checked(body)
    try:
        choice = wire_tools.choice_name(body.tool_choice, tools)
        constraint = wire_tools.reply_constraint(tools, choice, body.parallel_tool_calls, body.response_format)
    except wire_tools.GrammarError as exc:
        param = "response_format" if body.response_format is not None and body.response_format.type != "text" else "tools"
        raise ApiError(400, f"{param}: the schema cannot be compiled to a grammar: {exc}", param=param,
                       code="invalid_schema") from None  # fmt: skip
    except ValueError as exc:
        raise ApiError(400, f"tool_choice: {exc}", param="tool_choice") from None
    messages = _engine_messages(body.messages)
    sampling = SamplingParams(
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stops(),
        max_new_tokens=min(wanted or DEFAULT_MAX_TOKENS, max_seq_len // 2),
    )  # fmt: skip
    more = {"constraint": constraint, "tools": tools if choice != "none" else ()}
    if session:
        return GenerateRequest(f"http:{session}", messages, sampling, **more)
    return GenerateRequest(f"anon:{uuid.uuid4().hex}", messages, sampling, share_prefix=True, **more)


def remote_call(llm: Any, body: ChatRequest, session: str | None) -> tuple[Any, bool]:
    """The request for an LLM that is itself remote (models.llm.backend: openai): checked as ours (ids, choices,
    formats), then passed through with its tools; the server binds its own calls (no grammar is compiled here).
    -> (the call, whether tools were given)."""
    wanted, tools = _checked(body)
    fmt = body.response_format if body.response_format is not None and body.response_format.type != "text" else None
    try:
        choice = wire_tools.choice_name(body.tool_choice, tools)
        if choice not in ("none", "auto", "required", *(t.name for t in tools)):
            raise ValueError(f"tool_choice names {choice!r}, which is not among the tools ({', '.join(t.name for t in tools)})")
        if fmt is not None and choice != "none":
            raise ValueError("response_format with tools: set tool_choice to none, or leave response_format out")
    except ValueError as exc:
        raise ApiError(400, f"tool_choice: {exc}", param="tool_choice") from None
    ask = ToolAsk(tools, choice, body.parallel_tool_calls, None if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True))
    call = llm.generate(session or "", _engine_messages(body.messages), max_new_tokens=wanted or DEFAULT_MAX_TOKENS,
                        temperature=body.temperature, seed=body.seed, tools=ask, top_p=body.top_p, stop=body.stops())  # fmt: skip
    return call, bool(tools)


def _engine_messages(wire: list[Message]) -> tuple[ChatMessage, ...]:
    """The history as the engine renders it; a tool result must answer a call made earlier in it."""
    known: set[str] = set()
    out = []
    for i, m in enumerate(wire):
        try:
            calls = wire_tools.history_calls(m.tool_calls, known) if m.role == "assistant" else ()
        except ValueError as exc:
            raise ApiError(400, f"messages[{i}].tool_calls: {exc}", param=f"messages[{i}].tool_calls") from None
        if m.role == "tool" and (m.tool_call_id is None or m.tool_call_id not in known):
            raise ApiError(400, f"messages[{i}]: a tool message must answer a tool call of an earlier assistant message "
                                f"(tool_call_id {m.tool_call_id!r} is none of them)", param=f"messages[{i}].tool_call_id")  # fmt: skip
        role = "system" if m.role == "developer" else m.role
        out.append(ChatMessage(role, m.text(), calls, m.tool_call_id if m.role == "tool" else None))
    return tuple(out)


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
        session = body.user or request.headers.get(SESSION_HEADER)
        call: Any
        if engine is None:  # the LLM is itself remote: the request goes on to its server, tools and all
            call, tools = remote_call(runtime().stages.llm, body, session)
        else:
            req = engine_request(body, session, engine.max_seq_len)
            if req.constraint is not None:  # the tokenizer's grammar view is built once (~1 s): not on the event loop
                await asyncio.to_thread(constrain.warm, engine.tokenizer)
            call, tools = LlmCall(engine, req), bool(req.tools)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model or next(iter(model_ids))}
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_sse(call, head, usage, tools), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache", "x-accel-buffering": "no"})  # fmt: skip
        parts: list[str] = []
        async with aclosing(call):
            async for event in call:
                if isinstance(event, LlmToken):
                    parts.append(event.text)
                elif isinstance(event, LlmError):
                    raise ApiError(500 if engine is not None else 502, f"generation failed: {event.message}", type="server_error")
                else:
                    fin = event
        annotate_chat(head["model"], fin)
        if fin.reason == "context" and fin.generated_tokens == 0:
            raise ApiError(400, f"messages: the last message alone is longer than the context ({engine.max_seq_len} "
                           "tokens, less room for the reply)", param="messages", code="context_length_exceeded")  # fmt: skip
        message, called = wire_tools.message_of("".join(parts)) if tools else ({"role": "assistant", "content": "".join(parts)}, False)
        finish = "tool_calls" if called and fin.reason == "stop" else _FINISH[fin.reason]
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": _usage(fin)})

    return api


async def _sse(call: Any, head: dict[str, Any], include_usage: bool, tools: bool) -> AsyncIterator[str]:
    """Chunks as OpenAI streams them: the role, content deltas (or tool_calls deltas: index, id and name, then the
    arguments in fragments), the finish reason, the usage, then [DONE]."""
    parser = wire_tools.CallParser(wire_tools.new_call_id) if tools else None

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
                if parser is not None:
                    for delta in filter(None, map(wire_tools.stream_delta, parser.feed(event.text))):
                        yield chunk(delta)
                elif event.text:
                    yield chunk({"content": event.text})
            elif isinstance(event, LlmError):  # headers are sent: the error goes in the stream, as OpenAI's does
                err = {"message": f"generation failed: {event.message}", "type": "server_error", "param": None, "code": None}
                yield f"data: {json.dumps({'error': err})}\n\n"
                return
            else:
                for delta in filter(None, map(wire_tools.stream_delta, parser.close() if parser else [])):
                    yield chunk(delta)
                annotate_chat(head["model"], event)
                called = parser is not None and bool(parser.calls) and event.reason == "stop"
                yield chunk({}, "tool_calls" if called else _FINISH[event.reason])
                if include_usage:
                    yield chunk(None, usage=_usage(event))
    yield "data: [DONE]\n\n"
