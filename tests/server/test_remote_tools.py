"""Tools with a remote LLM (`models.llm.backend: openai`), for real: a front Parley whose LLM is another Parley's
/v1/chat/completions (the embedded model, which runs tools natively behind its own API, as vLLM would), on loopback.
The front has no engine: the tools, tool_choice and response_format go through to the server, and its tool_calls come
back through the chat API (whole and streamed), a voice session's tool turn and the Realtime API's function calls. A
server whose calls cannot be run (an unknown tool, arguments that are not JSON) is a clear error; nothing crashes.

The 135M model seldom chooses a tool by itself, so calls are forced with tool_choice (required or a name)."""
from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from types import SimpleNamespace

import httpx
import openai
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from in_thread import serve_in_thread
from llm_engine.tool_format import ToolSpec
from parley import runtime as rt
from parley.config import load_config
from server_config import TOKEN, write_test_config
from test_realtime import open_rt
from voice.llm_bridge import LlmError, LlmFinish, LlmToken, ToolAsk
from voice.remote.client import RemoteSpec
from voice.remote.llm import RemoteLlm
from voice.scheduler import DirectRunner
from web.app import create_app
from web.openai_api.app import create_stages_app
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KEY_ENV = "PARLEY_TEST_REMOTE_TOOLS_KEY"
TIME = {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "Europe/Paris"]}},
                       "required": ["zone"], "additionalProperties": False}}}  # fmt: skip
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                      "required": ["a", "b"], "additionalProperties": False}}}  # fmt: skip
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@dataclass
class Front:
    http: str  # the front server (no engine; its LLM is the remote)
    remote: RemoteLlm
    runtime: rt.Runtime


@pytest.fixture(scope="module")
def front(live_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, TOKEN)
        with serve_in_thread(create_stages_app(live_server.cfg, runtime=live_server.runtime), "remote-llm") as port:
            remote = RemoteLlm(RemoteSpec(f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV, timeout_s=120))
            root = tmp_path_factory.mktemp("front")
            path = write_test_config(root, openai_api=True)
            persona = root / "configs" / "personas" / "assistant.yaml"
            data = yaml.safe_load(persona.read_text())
            persona.write_text(yaml.safe_dump({**data, "tools": ["default"], "tool_choice": "current_time", "max_reply_tokens": 30}))
            cfg = load_config(path)
            # its own runner: the front's shutdown closes its runtime's, and the shared server's must outlive it
            stages = replace(live_server.runtime.stages, llm=remote, runner=DirectRunner())
            runtime = replace(live_server.runtime, stages=stages, engine=None)
            app = create_app(cfg, runtime=runtime)
            with serve_in_thread(app, "front", ws_max_size=cfg.server.max_message_bytes) as front_port:
                yield Front(f"http://127.0.0.1:{front_port}", remote, runtime)


@pytest.fixture
def client(front: Front) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{front.http}/v1", api_key=TOKEN, max_retries=0)


async def test_a_forced_call_through_the_remote_then_its_result_is_a_full_round_trip(client) -> None:
    first = await client.chat.completions.create(model="any", messages=ASK, tools=[TIME, ADD], tool_choice="required",
                                                 parallel_tool_calls=False, temperature=0, max_tokens=120)  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls or []) == 1, choice
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name in ("get_time", "add") and call.id.startswith("call_")
    assert set(args) == ({"zone"} if call.function.name == "get_time" else {"a", "b"})  # the remote's grammar held
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "It is 14:05 in Paris."}]  # fmt: skip
    answer = await client.chat.completions.create(model="any", messages=history, tools=[TIME, ADD], tool_choice="none",
                                                  temperature=0, max_tokens=30)  # fmt: skip
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.prompt_tokens > 0


async def test_a_named_call_streams_as_deltas_that_reassemble(client) -> None:
    stream = await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Add 2 and 3."}],
                                                  tools=[TIME, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
                                                  temperature=0, max_tokens=60, stream=True)  # fmt: skip
    parts: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                p = parts.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                p["id"] += d.id or ""
                p["name"] += (d.function.name or "") if d.function else ""
                p["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and list(parts) == [0] and parts[0]["name"] == "add" and parts[0]["id"].startswith("call_")
    args = json.loads(parts[0]["arguments"])
    assert set(args) == {"a", "b"} and all(isinstance(v, (int, float)) for v in args.values())


async def test_response_format_goes_through_and_bad_input_is_answered_by_the_front(client) -> None:
    reply = await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "A JSON object of a cat."}],
                                                 response_format={"type": "json_object"}, temperature=0, max_tokens=60)  # fmt: skip
    if reply.choices[0].finish_reason == "stop":  # (cut by max_tokens, a random object may be unfinished)
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="any", messages=ASK, tools=[TIME], tool_choice={"type": "function",
                                             "function": {"name": "nope"}})  # fmt: skip
    assert err.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="any", messages=[*ASK, {"role": "tool", "tool_call_id": "x", "content": "1"}])
    assert "tool_call_id" in err.value.body["param"]


async def test_a_voice_session_s_tool_turn_runs_through_the_remote(front: Front) -> None:
    """A typed "what time is it?" to a session whose persona forces the time tool: the remote makes the call, the
    front runs the tool and the remote answers from its result."""
    async with Client(front.http.replace("http", "ws") + f"/ws?token={TOKEN}") as c:
        await c.start()
        await c.wait_for("response.done")  # the greeting
        await c.send(type="input.text", text="What time is it?")
        done = await c.wait_for("response.done", n=2, timeout_s=180)
        trace = await c.wait_for("turn.trace", turn_id=done["turn_id"], timeout_s=60)
    assert trace["tools"][0]["name"] == "current_time" and trace["tools"][0]["ok"] is True, trace.get("tools")
    assert done["text"].strip() and "<tool_call>" not in done["text"] and not c.of("error")


async def test_a_persona_without_a_tools_list_is_offered_the_default_tools_by_a_remote_llm(front: Front) -> None:
    """`tools: auto` (the shipped personas' default): a remote LLM takes tools natively, so the concise persona, which
    lists none, is offered the shipped ones; its turn's request carries them (the trace's tools_offered)."""
    async with httpx.AsyncClient(base_url=front.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        personas = {p["name"]: p for p in (await http.get("/api/personas")).json()["personas"]}
    assert personas["concise"]["tools"] == ["current_time", "calculate", "set_timer"]
    assert personas["concise"]["tools_why"].startswith("tools: auto, and the LLM is remote (http://127.0.0.1:")
    assert personas["assistant"]["tools_why"] == "listed in the persona's tools:"
    async with Client(front.http.replace("http", "ws") + f"/ws?token={TOKEN}") as c:
        await c.start(persona="concise")
        await c.wait_for("response.done")  # the greeting
        await c.send(type="input.text", text="What is two plus two?")
        done = await c.wait_for("response.done", n=2, timeout_s=180)
        trace = await c.wait_for("turn.trace", turn_id=done["turn_id"], timeout_s=60)
    assert trace["tools_offered"] == ["current_time", "calculate", "set_timer"] and not c.of("error")
    assert "<tool_call>" not in done["text"]


async def test_a_realtime_function_call_round_trip_through_the_remote(front: Front) -> None:
    weather = {"type": "function", "name": "get_weather", "description": "Today's weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                              "required": ["city"], "additionalProperties": False}}  # fmt: skip
    async with AsyncExitStack() as stack:
        rt_ = await open_rt(SimpleNamespace(http=front.http), stack)
        await rt_.conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [weather],
                                               "tool_choice": {"type": "function", "name": "get_weather"}})  # fmt: skip
        await rt_.wait("session.updated")
        await rt_.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Weather in Paris?"}]})  # fmt: skip
        await rt_.conn.response.create()
        first = await rt_.wait("response.done")
        assert first.response.status == "completed", rt_.seen()
        (call,) = first.response.output
        assert call.type == "function_call" and call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
        await rt_.conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                      "output": json.dumps({"sky": "sunny"})})  # fmt: skip
        await rt_.conn.session.update(session={"type": "realtime", "tool_choice": "none"})
        await rt_.wait("session.updated", 2)
        await rt_.conn.response.create()
        second = await rt_.wait("response.done", 2)
        text = "".join(e.delta for e in rt_.of("response.output_text.delta"))
        assert second.response.status == "completed" and text.strip(), rt_.seen()


# -- a server whose calls cannot be run ----------------------------------------------------------------------------

def _bad_upstream() -> FastAPI:
    """A chat server that streams one tool call, as its request's `model` says: of a tool not given, or broken JSON."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        name, args = {"unknown-tool": ("rm_rf", ["{}"]), "bad-json": ("add", ['{"a": 1', ', "b": ']),
                      "good": ("add", ['{"a": 1', ', "b": 2}'])}[body["model"]]  # fmt: skip

        async def sse() -> AsyncIterator[str]:
            def chunk(delta: dict, finish: str | None = None) -> str:
                return "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                              "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"  # fmt: skip
            yield chunk({"role": "assistant", "content": ""})
            yield chunk({"tool_calls": [{"index": 0, "id": "srv_1", "type": "function", "function": {"name": name, "arguments": ""}}]})
            for a in args:
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
            yield chunk({}, "tool_calls")
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def bad_url() -> Iterator[str]:
    with serve_in_thread(_bad_upstream(), "bad-upstream") as port:
        yield f"http://127.0.0.1:{port}/v1"


async def test_calls_that_cannot_be_run_are_one_clear_error(bad_url: str) -> None:
    tools = ToolAsk((ToolSpec("add"),), "required")
    for model, says in (("unknown-tool", "'rm_rf', a tool it was not given"), ("bad-json", "add.*not JSON")):
        llm = RemoteLlm(RemoteSpec(bad_url, model=model))
        events = [e async for e in llm.generate("s", [("user", "hi")], max_new_tokens=20, tools=tools)]
        assert isinstance(events[-1], LlmError) and bad_url in events[-1].message, events
        assert re.search(says, events[-1].message), events[-1].message
        assert llm.active_slots() == 0
    good = [e async for e in RemoteLlm(RemoteSpec(bad_url, model="good")).generate("s", [("user", "hi")], max_new_tokens=20, tools=tools)]
    assert isinstance(good[0], LlmToken) and '"name": "add", "arguments": {"a": 1, "b": 2}' in good[0].text
    assert isinstance(good[-1], LlmFinish) and good[-1].reason == "stop"


async def test_the_chat_api_answers_a_bad_upstream_call_in_openai_s_shape(bad_url: str, live_server) -> None:
    runtime = replace(live_server.runtime, engine=None,
                      stages=replace(live_server.runtime.stages, llm=RemoteLlm(RemoteSpec(bad_url, model="unknown-tool"))))  # fmt: skip
    with serve_in_thread(create_stages_app(live_server.cfg, runtime=runtime), "bad-front") as port:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            await client.chat.completions.create(model="any", messages=ASK, tools=[ADD])
        assert err.value.status_code == 502 and "rm_rf" in err.value.body["message"]
        stream = await client.chat.completions.create(model="any", messages=ASK, tools=[ADD], stream=True)
        with pytest.raises(openai.APIError, match="rm_rf"):
            async for _ in stream:
                pass
        ok = await client.models.list()  # the server goes on
        assert ok.data
