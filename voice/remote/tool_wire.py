"""Tools over a chat server that runs them natively (vLLM, OpenAI, another `parley stages`): a conversation's tool
rounds as OpenAI messages (an assistant's `tool_calls`, `role: tool` with its call's id), the request's tool fields,
and the server's streamed `tool_calls` reassembled into the call text our engine writes (tool_format.call_text).

So a remote reply reaches the chat API, a voice session's tool turn and the Realtime API in the same shape as a local
one, and they parse it with the same CallParser. A call the server makes that cannot be run (a tool it was not given,
arguments that are not a JSON object) is a BadToolCall naming it. Pure: no sockets.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from llm_engine.request import ChatMessage
from llm_engine.tool_calls import CallParser, TextDelta
from llm_engine.tool_format import CALL_OPEN, ToolCall, ToolSpec, call_text

MAX_ARGUMENTS_CHARS = 32_000  # one call's arguments from the server (as the chat API bounds a client's)
MAX_CALLS = 64  # calls in one reply


class BadToolCall(ValueError):
    """The server's reply holds a call that cannot be run; the message says which and why."""


def wire_messages(messages: Sequence[tuple[str, str] | ChatMessage]) -> list[dict[str, Any]]:
    """(role, content) pairs or ChatMessages -> OpenAI's messages. A session's history keeps a call as its text (an
    assistant message with `<tool_call>`; the Realtime API's client calls) and its result as ("tool", output): such a
    call gets an id from its place in the conversation (the same every turn, so a server's prefix cache holds) and
    the result answers the oldest call still open. A result that answers no call goes as the user's message."""
    out: list[dict[str, Any]] = []
    open_ids: list[str] = []
    count = 0
    for m in messages:
        role, content, calls, call_id = (*m, (), None) if isinstance(m, tuple) else (m.role, m.content, m.tool_calls, m.tool_call_id)
        if role == "assistant" and not calls and CALL_OPEN in content:
            content, calls = _split_calls(content, count)
        if calls:
            count += len(calls)
            open_ids = [c.id for c in calls]
            out.append({"role": "assistant", "content": content or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]})  # fmt: skip
        elif role == "tool":
            answers = call_id if call_id in open_ids else (open_ids[0] if open_ids and call_id is None else None)
            if answers is None:
                out.append({"role": "user", "content": content})
            else:
                open_ids.remove(answers)
                out.append({"role": "tool", "tool_call_id": answers, "content": content})
        else:
            out.append({"role": role, "content": content})
    return out


def _split_calls(text: str, first: int) -> tuple[str, tuple[ToolCall, ...]]:
    ids = iter(range(first, first + MAX_CALLS + len(text)))
    parser = CallParser(lambda: f"call_{next(ids)}")
    deltas = parser.feed(text) + parser.close()
    return "".join(d.text for d in deltas if isinstance(d, TextDelta)).strip(), tuple(parser.calls)


def tool_fields(tools: Sequence[ToolSpec], choice: str, parallel: bool, response_format: dict[str, Any] | None) -> dict[str, Any]:
    """The request's tools, tool_choice, parallel_tool_calls and response_format as OpenAI takes them."""
    body: dict[str, Any] = {}
    if tools:
        body["tools"] = [t.openai() for t in tools]
        body["tool_choice"] = choice if choice in ("none", "auto", "required") else {"type": "function", "function": {"name": choice}}
        body["parallel_tool_calls"] = parallel
    if response_format is not None:
        body["response_format"] = response_format
    return body


class CallAssembler:
    """The server's streamed `delta.tool_calls` (an index; the id and name once; the arguments in fragments) put back
    together; `text()` gives the whole reply's calls as our engine writes them."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = set(names)
        self._calls: dict[int, dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, deltas: Sequence[Any]) -> None:
        """One chunk's `choices[i].delta.tool_calls` (the SDK's objects or dicts)."""
        for d in deltas:
            index = _get(d, "index")
            index = index if isinstance(index, int) else len(self._calls)
            if index not in self._calls and len(self._calls) >= MAX_CALLS:
                raise BadToolCall(f"more than {MAX_CALLS} tool calls in one reply")
            call = self._calls.setdefault(index, {"id": "", "name": "", "arguments": []})
            call["id"] = call["id"] or (_get(d, "id") or "")
            fn = _get(d, "function")
            if fn is None:
                continue
            call["name"] = call["name"] or (_get(fn, "name") or "")
            fragment = _get(fn, "arguments") or ""
            if not isinstance(fragment, str):
                raise BadToolCall(f"tool call {index}: arguments must be a string of JSON")
            call["arguments"].append(fragment)
            if sum(map(len, call["arguments"])) > MAX_ARGUMENTS_CHARS:
                raise BadToolCall(f"tool call {index} ({call['name'] or 'no name'}): arguments longer than {MAX_ARGUMENTS_CHARS} characters")

    def text(self) -> str:
        """Every call, checked, in the call format (tool_format.call_text), one after another. Raises BadToolCall."""
        texts = []
        for index in sorted(self._calls):
            c = self._calls[index]
            if c["name"] not in self.names:
                given = ", ".join(sorted(self.names)) or "none"
                raise BadToolCall(f"tool call {index} names {c['name']!r}, a tool it was not given (tools: {given})")
            raw = "".join(c["arguments"]).strip() or "{}"
            try:
                args = json.loads(raw)
            except ValueError as exc:
                raise BadToolCall(f"tool call {index} ({c['name']}): arguments are not JSON ({exc}): {raw[:80]!r}") from None
            if not isinstance(args, dict):
                raise BadToolCall(f"tool call {index} ({c['name']}): arguments must be a JSON object, not {raw[:80]!r}")
            texts.append(call_text(ToolCall(c["id"], c["name"], json.dumps(args))))
        return "\n".join(texts)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
