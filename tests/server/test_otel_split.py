"""A split deployment in one trace: `parley serve` with its LLM and its voice behind `parley stages --only llm,tts`,
both exporting to one real OTLP/HTTP receiver. The front end's remote calls carry `traceparent` (the LLM's from the
event loop, the speech's from a stage worker thread), so the stage server's request spans join the session's trace,
the chat request with GenAI's usage on it."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_config import TOKEN
from server_process import ServerProcess
from bench._otlp import OtlpReceiver
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY_ENV = "PARLEY_TEST_STAGES_KEY"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, OtlpReceiver]]:
    root = tmp_path_factory.mktemp("otel-split")
    receiver = OtlpReceiver()
    export = {"otlp_endpoint": receiver.url, "schedule_delay_ms": 50}
    llm = ServerProcess(root / "llm", command="stages", stages=["llm", "tts"],
                        more={"observability": {**export, "service_name": "parley-stages"}})  # fmt: skip
    front = None
    try:
        llm.start()
        remote = {"base_url": f"http://127.0.0.1:{llm.port}/v1", "api_key_env": KEY_ENV, "timeout_s": 60}
        front = ServerProcess(root / "front", env={KEY_ENV: TOKEN}, more={
            "models": {"llm": {"backend": "openai", "remote": remote}}, "observability": export,
            "voices": {"joe": {"backend": "openai", "remote": remote, "speaker": "joe"}}}).start()  # fmt: skip
        yield front, receiver
    finally:
        for proc in (front, llm):
            if proc is not None:
                proc.stop()
        receiver.close()


async def test_the_stage_servers_span_is_in_the_sessions_trace(split) -> None:
    front, receiver = split
    async with Client(front.ws_url(TOKEN)) as c:
        ready = await c.start(persona="concise")
        await c.wait_for("response.done")  # the greeting (no LLM call)
        await c.send(type="input.text", text="Name one colour.")
        done = await c.wait_for("response.done", n=2, timeout_s=180)
        assert done["text"].strip() and not done["interrupted"]
        await c.wait_for("turn.trace", turn_id=done["turn_id"], timeout_s=60)
    receiver.wait(lambda r: bool(r.named("parley.session")) and any(s.service == "parley-stages" for s in r.spans), timeout_s=60)
    session = next(s for s in receiver.named("parley.session") if s.attributes["parley.session_id"] == ready["session_id"])
    front_spans = [s for s in receiver.spans if s.service == "parley" and s.trace_id == session.trace_id]
    assert {"parley.session", "parley.turn"} <= {s.name for s in front_spans}
    remote = [s for s in receiver.spans if s.service == "parley-stages"]
    chat = [s for s in remote if s.attributes.get("url.path") == "/v1/chat/completions"]
    assert chat and all(s.trace_id == session.trace_id for s in chat)  # one trace across both processes
    assert all(s.parent_id == session.span_id for s in chat)
    speech = [s for s in remote if s.attributes.get("url.path") == "/v1/audio/speech"]
    assert speech and all(s.trace_id == session.trace_id and s.parent_id == session.span_id for s in speech)
    assert all(s.attributes["http.response.status_code"] == 200 and s.attributes["gen_ai.operation.name"] == "speech"
               for s in speech)  # fmt: skip
    reply = chat[-1]
    assert reply.name.startswith("chat ") and reply.attributes["http.response.status_code"] == 200
    assert reply.attributes["gen_ai.usage.output_tokens"] > 0 and reply.attributes["gen_ai.usage.input_tokens"] > 0
    turn = next(s for s in front_spans if s.name == "parley.turn")
    llm = next(s for s in front_spans if s.name.startswith("chat ") and s.parent_id == turn.span_id)
    assert llm.attributes["gen_ai.provider.name"] == "openai"
    assert llm.start_ns <= reply.start_ns  # the stage server's span starts after the front end sent the request
