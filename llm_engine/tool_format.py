"""How tools and tool calls appear in a prompt: the model's own chat template where it renders them (the Hermes /
Qwen2.5 `<tool_call>` format), otherwise our documented prompt format (docs/tools.md) in the same call syntax.

Pure functions over messages; no tokenizer, no grammar. Calls are written, in both formats, as
`<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}, "additionalProperties": false}'  # a JSON schema, as JSON

    def openai(self) -> dict[str, Any]:
        """The tool as the OpenAI API (and chat templates) write it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(self.parameters)}}  # fmt: skip


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (as OpenAI carries it)


def call_text(call: ToolCall) -> str:
    """A call as the model writes it (what the call grammar produces, byte for byte)."""
    return f'{CALL_OPEN}\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}\n{CALL_CLOSE}'


def template_renders_tools(template: str | None) -> bool:
    """A template that renders a tools list and writes calls in the `<tool_call>` format (Qwen2.5/Qwen3, Hermes)."""
    return bool(template) and "tools" in template and CALL_OPEN in template  # type: ignore[operator]


def our_tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The system prompt text that tells a model without tool support in its template how to call ours."""
    lines = [json.dumps({"name": t.name, "description": t.description, "parameters": json.loads(t.parameters)})
             for t in tools]  # fmt: skip
    return ("You can call these tools (JSON schemas):\n" + "\n".join(lines) + "\n"
            "To call one, reply with only:\n" + CALL_OPEN + '\n{"name": "<tool name>", "arguments": {<arguments>}}\n'
            + CALL_CLOSE + "\nThe result comes back in a message from \"tool\". Otherwise answer normally.")  # fmt: skip


def template_dicts(messages: Sequence[Any], tools: Sequence[ToolSpec], native: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """ChatMessages -> (the dicts a chat template renders, its `tools` argument or None).

    native: the template renders tools itself (template_renders_tools): calls go to it as OpenAI-shaped
    `tool_calls` with parsed arguments. Otherwise the tools join the system prompt in our format, a call becomes
    its text in the assistant's content, and a tool result stays a message from "tool".
    """
    dicts: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            if native:
                d["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                   for c in m.tool_calls]  # fmt: skip
            else:
                d["content"] = "\n".join(filter(None, [m.content, *(call_text(c) for c in m.tool_calls)]))
        if m.tool_call_id is not None and native:
            d["tool_call_id"] = m.tool_call_id
        dicts.append(d)
    if not tools:
        return dicts, None
    if native:
        return dicts, [t.openai() for t in tools]
    prompt = our_tools_prompt(tools)
    if dicts and dicts[0]["role"] == "system":
        dicts[0] = {**dicts[0], "content": f"{dicts[0]['content']}\n\n{prompt}"}
    else:
        dicts.insert(0, {"role": "system", "content": prompt})
    return dicts, None
