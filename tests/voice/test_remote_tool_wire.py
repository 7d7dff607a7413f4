"""Tools over a remote chat server, the pure part (voice.remote.tool_wire): a session's tool rounds become OpenAI
messages with call ids that answer each other, the request's tool fields, and streamed tool_calls deltas (in any
fragmenting) reassemble to the call text our engine writes, which the CallParser reads back as the same call; what
cannot be run is a BadToolCall naming it. (Against a real server: tests/server/test_remote_tools.py.)"""
from __future__ import annotations

import json
import random

import pytest

from llm_engine.request import ChatMessage
from llm_engine.tool_calls import CallParser, TextDelta
from llm_engine.tool_format import ToolCall, ToolSpec, call_text
from voice.remote.tool_wire import BadToolCall, CallAssembler, tool_fields, wire_messages

TIME = ToolSpec("current_time", "The time.")
ADD = ToolSpec("add", "Add.", json.dumps({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}))


def test_a_tool_round_of_chat_messages_keeps_its_ids() -> None:
    c = ToolCall("call_9", "current_time", "{}")
    wire = wire_messages([("system", "Be brief."), ("user", "time?"), ChatMessage("assistant", "", (c,)),
                          ChatMessage("tool", "The current_time tool says: noon", tool_call_id="call_9")])  # fmt: skip
    assert wire[2] == {"role": "assistant", "content": None,
                       "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "current_time", "arguments": "{}"}}]}
    assert wire[3] == {"role": "tool", "tool_call_id": "call_9", "content": "The current_time tool says: noon"}


def test_calls_kept_as_text_in_a_session_history_get_ids_from_their_place_and_results_answer_them() -> None:
    two = call_text(ToolCall("x", "add", '{"a": 1, "b": 2}')) + "\n" + call_text(ToolCall("y", "current_time", "{}"))
    history = [("user", "sum and time"), ("assistant", "Sure. " + two), ("tool", "3"), ("tool", "noon"),
               ("assistant", call_text(ToolCall("z", "current_time", "{}"))), ("tool", "one pm"), ("tool", "stray")]
    wire = wire_messages(history)
    assert wire[1]["content"] == "Sure." and [c["id"] for c in wire[1]["tool_calls"]] == ["call_0", "call_1"]
    assert [c["function"]["name"] for c in wire[1]["tool_calls"]] == ["add", "current_time"]
    assert json.loads(wire[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert [(m["role"], m.get("tool_call_id")) for m in wire[2:]] == [
        ("tool", "call_0"), ("tool", "call_1"), ("assistant", None), ("tool", "call_2"), ("user", None)]  # fmt: skip
    assert wire_messages(history) == wire  # the same ids every turn: a server's prefix cache holds
    assert wire_messages([("assistant", "no <tool_call> here, just words")])[0] == {
        "role": "assistant", "content": "no <tool_call> here, just words"}  # fmt: skip


def test_tool_fields_as_openai_takes_them() -> None:
    fields = tool_fields((TIME, ADD), "add", False, None)
    assert [t["function"]["name"] for t in fields["tools"]] == ["current_time", "add"]
    assert fields["tool_choice"] == {"type": "function", "function": {"name": "add"}} and fields["parallel_tool_calls"] is False
    assert tool_fields((TIME,), "required", True, None)["tool_choice"] == "required"
    assert tool_fields((), "none", True, {"type": "json_object"}) == {"response_format": {"type": "json_object"}}


@pytest.mark.parametrize("seed", range(5))
def test_streamed_deltas_in_any_fragments_reassemble_to_the_calls(seed: int) -> None:
    rng = random.Random(seed)
    calls = [("add", {"a": rng.randint(-99, 99), "b": rng.random()}), ("current_time", {}),
             ("add", {"a": 1, "b": 2, "note": 'quote " and \\ and ünï\n'})]  # fmt: skip
    deltas = []
    for i, (name, args) in enumerate(calls):
        text = json.dumps(args, indent=rng.choice([None, 2]))  # a server may write its JSON any way
        deltas.append({"index": i, "id": f"srv_{i}", "type": "function", "function": {"name": name, "arguments": ""}})
        at = 0
        while at < len(text):
            step = rng.randint(1, 7)
            deltas.append({"index": i, "function": {"arguments": text[at : at + step]}})
            at += step
    assembler = CallAssembler({"add", "current_time"})
    for d in deltas:
        assembler.feed([d])
    parser = CallParser(iter(["a", "b", "c"]).__next__)
    out = parser.feed("Checking. " + assembler.text()) + parser.close()
    assert "".join(d.text for d in out if isinstance(d, TextDelta)).strip() == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == calls


def test_what_cannot_be_run_is_a_bad_tool_call_naming_it() -> None:
    def text(*deltas: dict) -> str:
        a = CallAssembler({"add"})
        a.feed(list(deltas))
        return a.text()

    with pytest.raises(BadToolCall, match="'rm_rf', a tool it was not given \\(tools: add\\)"):
        text({"index": 0, "id": "1", "function": {"name": "rm_rf", "arguments": "{}"}})
    with pytest.raises(BadToolCall, match="add.*not JSON"):
        text({"index": 0, "id": "1", "function": {"name": "add", "arguments": '{"a": 1,'}})
    with pytest.raises(BadToolCall, match="JSON object"):
        text({"index": 0, "id": "1", "function": {"name": "add", "arguments": "[1, 2]"}})
    with pytest.raises(BadToolCall, match="longer than"):
        text({"index": 0, "id": "1", "function": {"name": "add", "arguments": '{"a": "' + "x" * 40_000 + '"}'}})
    assert text({"index": 0, "id": "1", "function": {"name": "add", "arguments": ""}}) == call_text(ToolCall("1", "add", "{}"))
