"""Function calling and structured output at /v1/chat/completions: the wire shapes (tools, tool_choice,
response_format, an assistant's tool_calls, role tool), their checks, and the reply's calls as OpenAI writes them.

It turns the wire into llm_engine's ToolSpec / ChatMessage / Constraint and a reply's text back into OpenAI's
message or stream deltas (llm_engine.tool_calls.CallParser); it knows nothing about routes or the engine thread.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llm_engine.constrain import Constraint, GrammarError, json_schema_grammar
from llm_engine.tool_calls import ArgumentsDelta, CallParser, CallStarted, Delta, TextDelta, call_constraint
from llm_engine.tool_format import ToolCall, ToolSpec

MAX_TOOLS = 128  # OpenAI's limit
MAX_ARGUMENTS_CHARS = 32_000  # one call's arguments in a request's history
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDef(_Wire):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(default="", max_length=10_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Wire):
    name: str


class NamedChoice(_Wire):
    type: Literal["function"]
    function: FunctionName


class CallFunction(_Wire):
    name: str
    arguments: str


class WireToolCall(_Wire):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CallFunction


class JsonSchemaFormat(_Wire):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


def tool_specs(tools: list[Tool] | None) -> tuple[ToolSpec, ...]:
    """-> the tools as the engine renders them; ValueError naming what is wrong (the caller makes it a 400)."""
    tools = tools or []
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"at most {MAX_TOOLS} tools")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
    specs = []
    for t in tools:
        params = t.function.parameters or {"type": "object", "properties": {}, "additionalProperties": False}
        specs.append(ToolSpec(t.function.name, t.function.description, json.dumps(params)))
    return tuple(specs)


def choice_name(choice: ToolChoice | None, tools: tuple[ToolSpec, ...]) -> str:
    """tool_choice -> "none" | "auto" | "required" | a tool's name (OpenAI's default: auto with tools, else none)."""
    if choice is None:
        return "auto" if tools else "none"
    name = choice if isinstance(choice, str) else choice.function.name
    if name != "none" and not tools:
        raise ValueError("tool_choice is only allowed when tools are given")
    return name


def reply_constraint(tools: tuple[ToolSpec, ...], choice: str, parallel: bool, fmt: ResponseFormat | None) -> Constraint | None:
    """The grammar the reply decodes under. Raises ValueError / GrammarError (both 400s, the caller names the field)."""
    if fmt is not None and fmt.type != "text":
        if choice != "none":
            raise ValueError("response_format with tools: set tool_choice to none, or leave response_format out")
        # Structured output closes at max_tokens (finish_reason stays "length", the content parses): docs/tools.md
        if fmt.type == "json_object":
            return Constraint(json_schema_grammar(True), close_at_limit=True)
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ValueError("response_format json_schema needs json_schema.schema")
        return Constraint(json_schema_grammar(fmt.json_schema.schema_), close_at_limit=True)
    return call_constraint(tools, choice, parallel=parallel)


def history_calls(calls: list[WireToolCall] | None, known: set[str]) -> tuple[ToolCall, ...]:
    """An assistant message's tool_calls -> the engine's; their ids join `known` (tool results must answer one)."""
    out = []
    for c in calls or []:
        if len(c.function.arguments) > MAX_ARGUMENTS_CHARS:
            raise ValueError(f"tool call {c.id}: arguments longer than {MAX_ARGUMENTS_CHARS} characters")
        try:
            args = json.loads(c.function.arguments or "{}")
        except ValueError:
            raise ValueError(f"tool call {c.id}: arguments are not JSON") from None
        if not isinstance(args, dict):
            raise ValueError(f"tool call {c.id}: arguments must be a JSON object")
        known.add(c.id)
        out.append(ToolCall(c.id, c.function.name, json.dumps(args)))
    return tuple(out)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def message_of(text: str) -> tuple[dict[str, Any], bool]:
    """A whole reply's text -> (OpenAI's assistant message, whether it holds calls)."""
    parser = CallParser(new_call_id)
    deltas = parser.feed(text) + parser.close()
    content = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    if not parser.calls:
        return {"role": "assistant", "content": content}, False
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parser.calls]
    return {"role": "assistant", "content": content or None, "tool_calls": calls}, True


def stream_delta(d: Delta) -> dict[str, Any] | None:
    """One parser delta -> the chunk's `delta` as OpenAI streams it (None: nothing to send)."""
    if isinstance(d, TextDelta):
        return {"content": d.text} if d.text else None
    if isinstance(d, CallStarted):
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}  # fmt: skip
    if isinstance(d, ArgumentsDelta):
        return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}
    return None  # CallDone: the arguments have all been sent


__all__ = ["GrammarError", "Tool", "ToolChoice", "ResponseFormat", "WireToolCall", "tool_specs", "choice_name",
           "reply_constraint", "history_calls", "message_of", "stream_delta", "new_call_id", "CallParser"]  # fmt: skip
