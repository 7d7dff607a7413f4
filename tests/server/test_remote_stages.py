"""Past one machine, for real: `parley serve` with recognition, the LLM and the voice all `backend: openai`,
pointed at stage servers on loopback, one per stage as deploy/ runs them (`parley stages --only llm` for the LLM,
one `--only asr,tts` for the rest, which also shows that a stage server may hold several), all three exporting to one
real OTLP/HTTP receiver. A typed turn is one trace across the processes: the front end's remote calls carry
`traceparent` (the LLM's from the event loop, the speech's from a stage worker thread), so the stage servers' request
spans join the session's trace, the chat request with GenAI's usage on it. A spoken question is answered end to end;
with the LLM's stage server killed the client is told why and the session lives; after a restart the next turn is
answered. (One topology for both: each start of it costs ~12 s of model loading.)"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench import corpus
from server_config import TOKEN
from server_process import ServerProcess
from bench._otlp import OtlpReceiver
from voice.audio import pcm16_to_float, resample
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY_ENV = "PARLEY_TEST_STAGES_KEY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess, OtlpReceiver]]:
    root = tmp_path_factory.mktemp("split")
    port = free_port()  # fixed, so the LLM's stage server comes back where the front end looks for it
    receiver = OtlpReceiver()
    export = {"otlp_endpoint": receiver.url, "schedule_delay_ms": 50}
    staged = {"observability": {**export, "service_name": "parley-stages"}}
    llm = ServerProcess(root / "llm", command="stages", port=port, stages=["llm"], more=staged)
    speech = ServerProcess(root / "speech", command="stages", stages=["asr", "tts"], more=staged)
    front = None
    try:
        with ThreadPoolExecutor(2) as pool:  # the two stage servers start together: each is mostly imports
            for started in [pool.submit(proc.start) for proc in (llm, speech)]:
                started.result()
        to_llm = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": KEY_ENV, "timeout_s": 20}
        to_speech = {**to_llm, "base_url": f"http://127.0.0.1:{speech.port}/v1"}
        more = {"models": {"asr": {"backend": "openai", "remote": to_speech}, "llm": {"backend": "openai", "remote": to_llm}},
                "voices": {"joe": {"backend": "openai", "remote": to_speech, "speaker": "joe"}},
                "observability": export}  # fmt: skip
        front = ServerProcess(root / "front", env={KEY_ENV: TOKEN}, more=more).start()
        yield llm, front, receiver
    finally:
        for proc in (front, speech, llm):
            if proc is not None:
                proc.stop()
        receiver.close()


def spoken(text: str) -> np.ndarray:
    audio, rate = corpus.speak_piper(text, deterministic=True)
    return np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1500)])


# first in the module: every span the stage servers have sent by then is this session's
async def test_the_stage_servers_span_is_in_the_sessions_trace(split) -> None:
    _, front, receiver = split
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


async def ask(c: Client, text: str, n: int) -> tuple[dict, dict]:
    await c.stream(spoken(text))
    final = await c.wait_for("transcript.final", n=n, timeout_s=120)
    done = await c.wait_for("response.done", turn_id=final["turn_id"], timeout_s=120)
    return final, done


async def test_a_spoken_question_through_remote_stages_and_a_stage_server_that_goes_away(split) -> None:
    stages, front, _ = split
    async with Client(front.ws_url(TOKEN)) as c:
        ready = await c.start(persona="concise")
        assert ready["output_sample_rate"] == 24000  # the speech server's rate: no Piper voice is local
        await c.wait_for("response.done")  # the greeting, spoken by the stage server
        question = corpus.REQUESTS[0]
        final, done = await ask(c, question, 1)
        assert corpus.wer(question, final["text"]) <= 0.15, final["text"]
        assert done["text"].strip() and not done["interrupted"]
        audio = resample(pcm16_to_float(c.turn_audio(final["turn_id"])), 24000, 16000)
        assert len(audio) > 0.5 * 16000  # spoken, at the session's rate
        trace = await c.wait_for("turn.trace", turn_id=final["turn_id"])
        assert trace["stages_ms"]["llm_ttft"] > 0 and "asr" in trace["stages_ms"]  # the remote stages, timed

        stages.kill()  # the LLM's stage server dies mid-session
        await c.stream(spoken(corpus.REQUESTS[1]))
        error = await c.wait_for("error", timeout_s=120)
        assert error["code"] in ("stage_failed", "reply_failed") and not error["fatal"]
        assert f"127.0.0.1:{stages.port}" in error["message"], error["message"]

        await asyncio.to_thread(stages.start)  # the loop answers the session's pings while it loads
        question = corpus.REQUESTS[2]
        finals = len(c.of("transcript.final"))
        final, done = await ask(c, question, finals + 1)
        assert corpus.wer(question, final["text"]) <= 0.15 and done["text"].strip()
