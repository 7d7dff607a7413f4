"""Function calling on /v1/realtime, driven by the official `openai` SDK against the real server (embedded models):
session.tools and tool_choice, the function_call item with its argument deltas, the client's function_call_output
and the answer made from it; a result for no call is an error and the session goes on.

The 135M model seldom chooses a tool by itself, so the first response is forced with a named tool_choice (as a
client may); the arguments are the model's own, valid by the grammar.
"""
from __future__ import annotations

import json
from contextlib import AsyncExitStack

import pytest

from test_realtime import open_rt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WEATHER = {"type": "function", "name": "get_weather", "description": "Today's weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                          "unit": {"enum": ["C", "F"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}  # fmt: skip


async def test_a_function_call_round_trip(live_server) -> None:
    async with AsyncExitStack() as stack:
        rt = await open_rt(live_server, stack)
        await rt.conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER],
                                              "tool_choice": {"type": "function", "name": "get_weather"}})  # fmt: skip
        updated = await rt.wait("session.updated")
        assert updated.session.tools[0].name == "get_weather" and updated.session.tool_choice.name == "get_weather"
        await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]})  # fmt: skip
        await rt.conn.response.create()
        first = await rt.wait("response.done")
        assert first.response.status == "completed", rt.seen()
        (call,) = first.response.output
        assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
        args = json.loads(call.arguments)  # valid by construction: the grammar of the schema
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("C", "F")
        added = [e for e in rt.of("response.output_item.added") if e.item.type == "function_call"]
        assert len(added) == 1 and added[0].item.call_id == call.call_id and added[0].output_index == 0
        deltas = [e for e in rt.of("response.function_call_arguments.delta") if e.call_id == call.call_id]
        done = rt.of("response.function_call_arguments.done")[0]
        assert "".join(e.delta for e in deltas) == done.arguments == call.arguments and done.name == "get_weather"
        assert not rt.of("response.output_text.delta")  # the call is not said

        # a result for no call is refused; the session goes on
        await rt.conn.conversation.item.create(item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"})
        error = await rt.wait("error")
        assert error.error.param == "item.call_id", error.error

        await rt.conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                     "output": json.dumps({"sky": "sunny", "temperature": 18})})  # fmt: skip
        echoed = [e for e in rt.of("conversation.item.done") if e.item.type == "function_call_output"]
        while not echoed:
            await rt.wait("conversation.item.done", len(rt.of("conversation.item.done")) + 1)
            echoed = [e for e in rt.of("conversation.item.done") if e.item.type == "function_call_output"]
        assert echoed[0].item.call_id == call.call_id
        await rt.conn.session.update(session={"type": "realtime", "tool_choice": "auto"})  # the answer may be text
        await rt.wait("session.updated", 2)
        await rt.conn.response.create()
        second = await rt.wait("response.done", 2)
        assert second.response.status == "completed", rt.seen()
        kinds = [o.type for o in second.response.output]
        text = "".join(e.delta for e in rt.of("response.output_text.delta"))
        assert kinds == ["message"] and text.strip(), (kinds, text)  # answered from the result, in words
        print(f"\ncall {call.arguments}; answer {text!r}")
