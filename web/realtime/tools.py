"""Function calling on /v1/realtime: `session.tools` and `tool_choice` checked and turned into the engine's ToolSpecs,
and a client's `function_call_output` item checked against the calls it can answer. Pure: no sockets, no session.

The calls themselves stream from the voice session (voice.tool_turn, `tool.call.*` messages) and become
`response.output_item.added` / `response.function_call_arguments.delta` / `.done` in web.realtime.translate.
"""
from __future__ import annotations

import json
import re
from typing import Any

from llm_engine.constrain import GrammarError
from llm_engine.tool_calls import call_constraint
from llm_engine.tool_format import ToolSpec

MAX_TOOLS = 128
MAX_OUTPUT_CHARS = 32_000  # a function_call_output's output
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


def tool_specs(tools: list[Any]) -> tuple[ToolSpec, ...]:
    """session.tools (OpenAI's Realtime shape: {type: function, name, description, parameters}) -> ToolSpecs.
    ValueError naming what is wrong (the endpoint makes it an `error` event with param session.tools)."""
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"at most {MAX_TOOLS} tools")
    specs = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise ValueError(f"tools[{i}]: only function tools are supported")
        name, params = t.get("name"), t.get("parameters") or _EMPTY
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"tools[{i}].name: 1 to 64 letters, digits, _ or -")
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].parameters: a JSON schema object")
        description = t.get("description") or ""
        if not isinstance(description, str):
            raise ValueError(f"tools[{i}].description: a string")
        specs.append(ToolSpec(name, description[:10_000], json.dumps(params)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
    try:
        if specs:
            call_constraint(specs, "required")  # every schema compiles to a grammar now, not at the first reply
    except GrammarError as exc:
        raise ValueError(f"the schema cannot be compiled to a grammar: {exc}") from None
    return tuple(specs)


def choice_name(choice: Any, specs: tuple[ToolSpec, ...]) -> str:
    """tool_choice ("auto" | "none" | "required" | {type: function, name}) -> "auto" | "none" | "required" | a name."""
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    name = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise ValueError('tool_choice: "auto", "none", "required" or {"type": "function", "name": ...}')
    if name not in {s.name for s in specs}:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(s.name for s in specs)})")
    return name


def wire_choice(name: str) -> Any:
    return name if name in ("auto", "none", "required") else {"type": "function", "name": name}


def check_output(item: dict[str, Any], open_calls: set[str]) -> tuple[str, str]:
    """A function_call_output item -> (call_id, output); ValueError when it answers no call of this session that is
    still open, or its output is not a string of at most MAX_OUTPUT_CHARS."""
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or call_id not in open_calls:
        raise ValueError("item.call_id: a function_call_output must answer a function call of this session not yet answered")
    if not isinstance(output, str) or len(output) > MAX_OUTPUT_CHARS:
        raise ValueError(f"item.output: a string of at most {MAX_OUTPUT_CHARS} characters")
    return call_id, output
