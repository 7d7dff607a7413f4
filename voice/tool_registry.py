"""Server-side tools: Python functions named `module:function` become ToolSpecs (the JSON schema read from the
signature and docstring) and are run for a call with a per-tool timeout; raising or timing out is a result too.

It knows llm_engine's ToolSpec/ToolCall and asyncio; nothing about sessions, audio or the wire. docs/tools.md.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_engine.tool_format import ToolCall, ToolSpec

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
DEFAULT_TIMEOUT_S = 10.0
MAX_RESULT_CHARS = 4000  # what goes back into the prompt


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    fn: Callable[..., Any]
    timeout_s: float = DEFAULT_TIMEOUT_S
    cancellable: bool = True  # a barge-in cancels the running call (False: it finishes; its result is kept)


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    ok: bool
    content: str  # the value as text, or what went wrong
    ms: float


def schema_of(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """-> (description, parameters schema) from the signature (str, int, float, bool, Literal, Optional, list of
    those) and the docstring: its first paragraph describes the tool, `name: text` lines describe parameters."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = doc.split("\n\n")
    described = {}
    for line in doc.splitlines():
        name, sep, text = line.strip().partition(":")
        if sep and name.isidentifier():
            described[name] = text.strip()
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(p.name, str), f"{fn.__name__}({p.name})")
        if p.name in described:
            prop["description"] = described[p.name]
        props[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return paragraphs[0].replace("\n", " ").strip(), schema


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _json_type(inner, where)
    if origin is list and args:
        return {"type": "array", "items": _json_type(args[0], where)}
    raise TypeError(f"{where}: parameter type {hint!r} has no JSON schema here (str, int, float, bool, Literal, list)")


def tool_from(fn: Callable[..., Any], *, name: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
              cancellable: bool = True, parameters: dict[str, Any] | None = None) -> Tool:  # fmt: skip
    description, schema = schema_of(fn) if parameters is None else ((inspect.getdoc(fn) or "").split("\n\n")[0], parameters)
    return Tool(ToolSpec(name or fn.__name__, description, json.dumps(schema)), fn, timeout_s, cancellable)


def load(ref: str, **options: Any) -> Tool:
    """'package.module:function' -> a Tool; ValueError saying what cannot be found."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"tool {ref!r}: write it as module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"tool {ref!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"tool {ref!r} is not a function")
    return tool_from(fn, **options)


class ToolBox:
    """A persona's tools by name; run() answers a call with a ToolResult, whatever the function does."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = {t.spec.name: t for t in tools}

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self.tools.values())

    async def run(self, call: ToolCall) -> ToolResult:
        """Cancelling the task that awaits this cancels the call (a thread running a plain function is left to end;
        its result is dropped)."""
        t0 = time.perf_counter()
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(call, False, f"error: there is no tool named {call.name}", 0.0)
        try:
            args = json.loads(call.arguments or "{}")
            if inspect.iscoroutinefunction(tool.fn):
                value = await asyncio.wait_for(tool.fn(**args), tool.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **args), tool.timeout_s)
        except asyncio.TimeoutError:
            return ToolResult(call, False, f"error: {call.name} did not answer within {tool.timeout_s:g} s", _ms(t0))
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to hear about, not the session's end
            return ToolResult(call, False, f"error: {type(exc).__name__}: {exc}", _ms(t0))
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(call, True, text[:MAX_RESULT_CHARS], _ms(t0))


def _ms(t0: float) -> float:
    return 1000 * (time.perf_counter() - t0)
