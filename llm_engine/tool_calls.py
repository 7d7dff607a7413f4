"""Tool calls on the way out: the grammar a reply decodes under for a tool_choice, and the parser that splits the
reply's streamed text into content and calls (name first, then argument fragments, as OpenAI streams them).

Shared by the chat API, the Realtime API and the voice session. Pure: no engine, no wire, no clock.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from llm_engine.constrain import JSON_LAYOUT, Constraint, GrammarError, check_grammar
from llm_engine.tool_format import CALL_CLOSE, CALL_OPEN, ToolCall, ToolSpec

MAX_CALLS = 8  # calls in one reply with parallel tool calls (a bound, so a looping model still ends)
BARE_START = '{"name"'  # a reply that begins so is a call written without its markers (the grammar's own layout)


def call_constraint(tools: Sequence[ToolSpec], choice: str, *, parallel: bool = True) -> Constraint | None:
    """tool_choice "none" | "auto" | "required" | a tool's name -> the reply's grammar (None: free text).

    auto: free text until the model writes the call marker, then the call grammar from there; or a call written
    bare, without the markers, when the reply begins with its JSON (BARE_START: as Qwen2.5's small models write calls
    under auto), then that one call and the reply ends; required or a name:
    the call grammar from the first token (a name: exactly one call). parallel: up to MAX_CALLS calls in a reply. Raises GrammarError (a schema the library cannot compile) or
    ValueError (a name that is no tool).
    """
    if choice == "none" or not tools:
        if choice not in ("none", "auto"):
            raise ValueError(f"tool_choice names {choice!r} but no tools were given")
        return None
    if choice not in ("auto", "required"):
        named = [t for t in tools if t.name == choice]
        if not named:
            raise ValueError(f"tool_choice names {choice!r}, which is not among the tools ({', '.join(t.name for t in tools)})")
        tools, parallel = named, False  # a named function: that one call (OpenAI's "call this function")
    bodies = []
    for t in tools:
        try:
            params = json.loads(t.parameters)
        except ValueError as exc:
            raise GrammarError(f"tool {t.name!r}: parameters are not JSON: {exc}") from None
        bodies.append({"type": "object", "properties": {"name": {"const": t.name}, "arguments": params},
                       "required": ["name", "arguments"], "additionalProperties": False})  # fmt: skip
    schema = {"anyOf": bodies, "x-guidance": JSON_LAYOUT} if len(bodies) > 1 else {**bodies[0], "x-guidance": JSON_LAYOUT}
    more = ""
    for _ in range(MAX_CALLS - 1 if parallel else 0):  # nested optionals: at most MAX_CALLS calls in all
        more = f'("\\n" {_lark(CALL_OPEN)} "\\n" body "\\n" {_lark(CALL_CLOSE)} {more})?'
    rest = f'"\\n" body "\\n" {_lark(CALL_CLOSE)} {more}'
    start = f"({rest}) | body" if choice == "auto" else f"{_lark(CALL_OPEN)} {rest}"
    try:
        grammar = check_grammar(f"start: {start}\nbody: %json {json.dumps(schema)}\n")
    except GrammarError as exc:
        raise GrammarError(f"the tools' schemas do not compile: {exc}") from None
    if choice != "auto":
        return Constraint(grammar, markers=(CALL_OPEN, CALL_CLOSE))
    return Constraint(grammar, trigger=CALL_OPEN, bare_start=BARE_START, markers=(CALL_OPEN, CALL_CLOSE))


def _lark(text: str) -> str:
    return json.dumps(text)


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallStarted:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class CallDone:
    call: ToolCall
    index: int


Delta = TextDelta | CallStarted | ArgumentsDelta | CallDone

_HEAD = re.compile(r'\s*\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')


class CallParser:
    """Feed the reply's text as it streams; get content and call deltas. A call's arguments stream as they are
    written, one character held back (the call's own closing brace). A reply that begins with BARE_START is one call
    written without its markers (call_constraint's auto grammar allows it), ended by the reply's end. Text that only
    looks like a call (it does not parse: a reply decoded without the call grammar) comes out as text."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.buf = ""  # text not yet given out: a possible marker's start, or the call being written
        self.in_call = False
        self.calls: list[ToolCall] = []
        self._head: tuple[str, int] | None = None  # (name, where the arguments start in buf)
        self._sent = 0  # argument characters given out
        self._id = ""  # the id of the call being written
        self._opening = True  # nothing given out yet: the reply may still be a bare call
        self._bare = False  # the call being written has no markers: it ends with the reply

    def feed(self, text: str) -> list[Delta]:
        self.buf += text
        out: list[Delta] = []
        if self._opening:
            start = self.buf.lstrip()
            if BARE_START.startswith(start):
                return out  # white space, or the bare call's first characters: not known yet
            self._opening = False
            if start.startswith(BARE_START):
                self.buf, self.in_call, self._bare = start, True, True
                return self._call_progress(self.buf)
        if self._bare:
            return self._call_progress(self.buf)
        while True:
            if not self.in_call:
                at = self.buf.find(CALL_OPEN)
                if at < 0:
                    keep = _partial_suffix(self.buf, CALL_OPEN)
                    if self.buf[: len(self.buf) - keep].strip():  # white space alone is held: it may separate calls
                        out.append(TextDelta(self.buf[: len(self.buf) - keep]))
                        self.buf = self.buf[len(self.buf) - keep :]
                    return out
                if self.buf[:at].strip():
                    out.append(TextDelta(self.buf[:at]))
                self.buf, self.in_call = self.buf[at + len(CALL_OPEN) :], True
                self._head, self._sent = None, 0
            end = self.buf.find(CALL_CLOSE)
            out += self._call_progress(self.buf if end < 0 else self.buf[:end])
            if end < 0:
                return out
            out += self._finish_call(self.buf[:end])
            self.buf, self.in_call = self.buf[end + len(CALL_CLOSE) :].lstrip("\n"), False

    def close(self) -> list[Delta]:
        """The reply ended: a bare call, or one whose JSON is whole but its closing marker missing, is a call; a call
        left open (cut by max_tokens) is given out as text if nothing of it was, else dropped: never run on a guess."""
        out: list[Delta] = []
        if self.in_call and _parses(self.buf):
            out += self._finish_call(self.buf.rstrip())
            self.in_call = False
        elif self.in_call:
            if self._head is None:
                out.append(TextDelta(self.buf if self._bare else CALL_OPEN + self.buf))
        elif self.buf and (self.buf.strip() or not self.calls):
            out.append(TextDelta(self.buf))
        self.buf = ""
        return out

    def _call_progress(self, body: str) -> list[Delta]:
        out: list[Delta] = []
        if self._head is None:
            m = _HEAD.match(body)
            if m is None:
                return out
            self._head, self._id = (json.loads(m.group(1)), m.end()), self.new_id()
            out.append(CallStarted(len(self.calls), self._id, self._head[0]))
        args = body[self._head[1] :].split("\n", 1)[0]  # compact JSON has no raw newline: one ends the arguments
        upto = len(args) - 1  # the last character may be the call's own closing brace
        if upto > self._sent:
            out.append(ArgumentsDelta(len(self.calls), args[self._sent : upto]))
            self._sent = upto
        return out

    def _finish_call(self, body: str) -> list[Delta]:
        try:
            obj = json.loads(body)
            name, arguments = obj["name"], obj["arguments"]
            assert isinstance(name, str) and isinstance(arguments, dict)
        except (ValueError, KeyError, TypeError, AssertionError):
            return [] if self._head is not None else [TextDelta(f"{CALL_OPEN}{body}{CALL_CLOSE}")]
        out: list[Delta] = []
        if self._head is None:  # written in another layout (no grammar): the call comes out whole
            self._head, self._id = (name, 0), self.new_id()
            out.append(CallStarted(len(self.calls), self._id, name))
            text = json.dumps(arguments)
        else:
            text = body[self._head[1] :].split("\n", 1)[0][:-1]
        if len(text) > self._sent:
            out.append(ArgumentsDelta(len(self.calls), text[self._sent :]))
        call = ToolCall(self._id, name, text)
        self.calls.append(call)
        self._head, self._sent = None, 0
        return [*out, CallDone(call, len(self.calls) - 1)]


def opens_call(text: str) -> bool:
    """The reply's text begins a tool call (its marker, or a bare call's JSON): not words to say."""
    start = text.lstrip()
    return start.startswith(BARE_START) or start.startswith(CALL_OPEN)


def _parses(body: str) -> bool:
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of text that begins the marker (held back: it may be a call starting)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
