"""Function calling and structured output at /v1/chat/completions, driven by the official `openai` SDK on the
embedded SmolLM2 (real server, loopback): a full round trip with a role tool result, streamed tool_calls deltas
that reassemble to the whole call, parallel_tool_calls, response_format, and bad input answered in OpenAI's shape.

The 135M model rarely chooses a tool by itself, so calls are asked for with tool_choice required or a name (forced
by the grammar from the first token); auto is exercised where the reply may be either."""
from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from in_thread import serve_in_thread
from server_config import TOKEN
from web.openai_api.app import create_stages_app

pytestmark = pytest.mark.slow

TIME = {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]}},
                       "required": ["zone"], "additionalProperties": False}}}  # fmt: skip
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                      "required": ["a", "b"], "additionalProperties": False}}}  # fmt: skip
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@pytest.fixture(scope="module")
def tools_url(live_server) -> Iterator[str]:
    app = create_stages_app(live_server.cfg, runtime=live_server.runtime)
    with serve_in_thread(app, "tools-stages-server") as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def client(tools_url) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=tools_url, api_key=TOKEN, max_retries=0)


async def test_a_forced_call_then_its_result_in_the_history_is_a_full_round_trip(client):
    """parallel_tool_calls off: allowed more, the 135M model repeats its call until max_tokens (docs/tools.md)."""
    first = await client.chat.completions.create(model="any", messages=ASK, tools=[TIME, ADD], tool_choice="required",
                                                 parallel_tool_calls=False, temperature=0, max_tokens=120)  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.id.startswith("call_") and call.type == "function" and call.function.name in ("get_time", "add")
    if call.function.name == "get_time":
        assert args["zone"] in ("UTC", "Europe/Paris", "Asia/Tokyo") and set(args) == {"zone"}
    else:
        assert set(args) == {"a", "b"} and all(isinstance(v, (int, float)) for v in args.values())
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "It is 14:05 in Paris."}]  # fmt: skip
    answer = await client.chat.completions.create(model="any", messages=history, tools=[TIME, ADD], tool_choice="none",
                                                  temperature=0, max_tokens=40)  # fmt: skip
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    plain = await client.chat.completions.create(model="any", messages=ASK, max_tokens=1)
    call_and_result = len('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>14:05 Paris') // 4
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens + call_and_result  # both are in the prompt


async def test_streamed_tool_call_deltas_reassemble_to_the_whole_call(client):
    kwargs = dict(model="any", messages=[{"role": "user", "content": "Add 2.5 and 4."}], tools=[TIME, ADD],
                  tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0, max_tokens=80)  # fmt: skip
    whole = (await client.chat.completions.create(**kwargs)).choices[0]
    stream = await client.chat.completions.create(**kwargs, stream=True)
    chunks = [c async for c in stream]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "add" and deltas[0].index == 0
    assert len(deltas) > 2 and all(d.id is None and d.function.name is None for d in deltas[1:])  # fragments follow
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert arguments == whole.message.tool_calls[0].function.arguments
    assert set(json.loads(arguments)) == {"a", "b"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


async def test_parallel_tool_calls_false_makes_one_call_at_most(client):
    reply = await client.chat.completions.create(model="any", messages=ASK, tools=[TIME, ADD], tool_choice="required",
                                                 parallel_tool_calls=False, temperature=1.0, seed=3, max_tokens=200)  # fmt: skip
    assert len(reply.choices[0].message.tool_calls) == 1 and reply.choices[0].finish_reason == "tool_calls"
    both = await client.chat.completions.create(model="any", messages=ASK, tools=[TIME, ADD], tool_choice="required",
                                                temperature=0, max_tokens=100)  # fmt: skip
    calls = both.choices[0].message.tool_calls  # allowed several, the 135M model repeats its call: several valid ones
    assert len(calls) > 1 and all(json.loads(c.function.arguments) for c in calls) and len({c.id for c in calls}) == len(calls)


async def test_auto_gives_either_text_or_valid_calls(client):
    for seed in range(3):
        reply = await client.chat.completions.create(model="any", messages=ASK, tools=[TIME], temperature=1.0,
                                                     seed=seed, max_tokens=60)  # fmt: skip
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            assert json.loads(message.tool_calls[0].function.arguments)["zone"] in ("UTC", "Europe/Paris", "Asia/Tokyo")
        else:
            assert message.content and "<tool_call>" not in message.content


async def test_response_format_json_schema_and_json_object(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
              "population_millions": {"type": "number"}, "capital": {"type": "boolean"}},
              "required": ["city", "population_millions", "capital"], "additionalProperties": False}  # fmt: skip
    reply = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Describe Paris as JSON."}], temperature=0, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})  # fmt: skip
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == set(schema["required"]) and isinstance(value["capital"], bool) and reply.choices[0].finish_reason == "stop"
    obj = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Give me a JSON object about Paris."}], temperature=0,
        max_tokens=60, response_format={"type": "json_object"})  # fmt: skip
    # the model ends the object, or the limit closes it: it parses either way
    assert isinstance(json.loads(obj.choices[0].message.content), dict) and obj.choices[0].finish_reason in ("stop", "length")


async def test_a_json_schema_reply_at_a_tight_max_tokens_still_parses_streamed_or_whole(client):
    """The 135M model keeps adding fruits: cut at 24 tokens inside the array without closing (docs/tools.md)."""
    schema = {"type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string"}}},
              "required": ["fruits"], "additionalProperties": False}  # fmt: skip
    kwargs = dict(model="any", messages=[{"role": "user", "content": "List five fruits. Reply in JSON."}], temperature=0,
                  max_tokens=24, response_format={"type": "json_schema", "json_schema": {"name": "fruits", "schema": schema}})  # fmt: skip
    whole = await client.chat.completions.create(**kwargs)
    value = json.loads(whole.choices[0].message.content)
    assert set(value) == {"fruits"} and value["fruits"] and all(isinstance(f, str) for f in value["fruits"])
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens <= 24
    chunks = [c async for c in await client.chat.completions.create(**kwargs, stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


async def test_bad_tool_input_is_answered_in_openai_s_shape_and_the_server_goes_on(client):
    bogus = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "bogus"}}}}}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}  # fmt: skip
    huge = {**call, "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "get_time", "arguments": json.dumps({"x": "y" * 40_000})}}]}  # fmt: skip
    cases = [
        (dict(messages=ASK, tools=[bogus], tool_choice="required"), "tools", "cannot be compiled"),
        (dict(messages=ASK, tools=[TIME], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "not among the tools"),
        (dict(messages=ASK, tool_choice="required"), "tool_choice", "only allowed when tools"),
        (dict(messages=[*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}], tools=[TIME]), "messages[1].tool_call_id", "must answer"),
        (dict(messages=[*ASK, huge, {"role": "tool", "tool_call_id": "call_1", "content": "x"}], tools=[TIME]), "messages[1].tool_calls", "longer than"),
        (dict(messages=ASK, tools=[TIME, TIME]), "tools", "unique"),
        (dict(messages=ASK, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}), "response_format", "cannot be compiled"),
    ]  # fmt: skip
    for kwargs, param, words in cases:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="any", max_tokens=5, **kwargs)
        assert err.value.body["param"] == param and words in err.value.body["message"], (param, err.value.body)
        assert err.value.body["type"] == "invalid_request_error"
    ok = await client.chat.completions.create(model="any", messages=[*ASK, call, {"role": "tool", "tool_call_id": "call_1",
                                              "content": "12:00"}], tools=[TIME], max_tokens=5, temperature=0)  # fmt: skip
    assert ok.choices[0].finish_reason in ("stop", "length", "tool_calls")
