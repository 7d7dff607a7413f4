"""/v1/realtime driven by the official `openai` SDK's realtime client against the real server (embedded models):
a spoken question under turn detection, manual commits, a typed question (also text-only), response.cancel,
barge-in then conversation.item.truncate, and bad events that leave the session working."""
from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
import openai
import pytest

from bench import corpus
from server_config import TOKEN
from voice.audio import resample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RATE = 24000


def pcm24(audio16: np.ndarray) -> bytes:
    return (np.clip(resample(audio16, 16000, RATE), -1, 1) * 32767).astype("<i2").tobytes()


def spoken(text: str, tail_ms: int = 1500) -> bytes:
    audio, rate = corpus.speak_piper(text, deterministic=True)
    return pcm24(np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(tail_ms)]))


class Rt:
    """The SDK connection plus every event it received, in order."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[Any] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.conn:
            self.events.append(event)
            self._changed.set()

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    async def wait(self, kind: str, n: int = 1, timeout_s: float = 60.0) -> Any:
        """The n-th event of `kind` (the timeout is a safety net, not a speed assertion)."""
        try:
            async with asyncio.timeout(timeout_s):
                while len(self.of(kind)) < n:
                    assert not self._reader.done(), f"connection closed before {kind}: {self.seen()}"
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no {kind} #{n} in {timeout_s} s: {self.seen()}") from None
        return self.of(kind)[n - 1]

    def seen(self) -> list[str]:
        return [e.type + (f" {e.error.code}: {e.error.message}" if e.type == "error" else "") for e in self.events
                if "delta" not in e.type]  # fmt: skip

    async def stream(self, pcm: bytes, chunk_ms: int = 100) -> None:
        """Append audio in chunks, paced like a microphone."""
        step = RATE * chunk_ms // 1000 * 2
        t0 = time.monotonic()
        for i in range(0, len(pcm), step):
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
            ahead = (i + step) / 2 / RATE - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)

    def audio(self, response_id: str) -> np.ndarray:
        pcm = b"".join(base64.b64decode(e.delta) for e in self.of("response.output_audio.delta") if e.response_id == response_id)
        return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


async def open_rt(live_server: Any, stack: Any) -> Rt:
    client = openai.AsyncOpenAI(base_url=f"{live_server.http}/v1", api_key=TOKEN, max_retries=0)
    conn = await stack.enter_async_context(client.realtime.connect(model="parley"))
    rt = Rt(conn)
    created = await rt.wait("session.created")
    assert created.session.audio.output.format.rate == RATE
    return rt


@pytest.fixture
async def rt(live_server):
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        yield await open_rt(live_server, stack)


@pytest.mark.parametrize("detection", ["server_vad", "semantic_vad"])
async def test_a_spoken_question_under_turn_detection(rt: Rt, live_server, detection: str) -> None:
    await rt.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {"type": detection}}}})
    assert (await rt.wait("session.updated")).session.audio.input.turn_detection.type == detection
    question = corpus.REQUESTS[0]
    await rt.stream(spoken(question))
    done = await rt.wait("response.done")
    started, stopped = rt.of("input_audio_buffer.speech_started")[0], rt.of("input_audio_buffer.speech_stopped")[0]
    assert started.item_id == stopped.item_id == rt.of("input_audio_buffer.committed")[0].item_id
    assert 0 < started.audio_start_ms < stopped.audio_end_ms
    heard = rt.of("conversation.item.input_audio_transcription.completed")[0]
    assert heard.item_id == started.item_id and corpus.wer(question, heard.transcript) <= 0.15, heard.transcript
    assert done.response.status == "completed"
    transcript = rt.of("response.output_audio_transcript.done")[0].transcript
    assert transcript.strip() and transcript == "".join(e.delta for e in rt.of("response.output_audio_transcript.delta"))
    order = [e.type for e in rt.events if e.type.startswith("response.") and "delta" not in e.type]
    assert order[:3] == ["response.created", "response.output_item.added", "response.content_part.added"]
    assert order[-1] == "response.done"
    audio16 = resample(rt.audio(done.response.id), RATE, 16000)
    again = live_server.runtime.stages.transcriber.transcribe(audio16).text
    assert corpus.wer(transcript, again) <= 0.25, (transcript, again)
    trace = (await rt.wait("parley.turn.trace")).trace  # the Parley extension: the turn's latency trace
    assert trace["stages_ms"]["voice_to_voice"] > 0


async def test_manual_commits_and_a_typed_text_only_question(rt: Rt) -> None:
    await rt.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    updated = await rt.wait("session.updated")
    assert updated.session.audio.input.turn_detection is None
    question = corpus.REQUESTS[1]
    await rt.stream(spoken(question, tail_ms=200))
    await rt.conn.input_audio_buffer.commit()
    heard = await rt.wait("conversation.item.input_audio_transcription.completed")
    assert corpus.wer(question, heard.transcript) <= 0.15, heard.transcript
    # the transcription of the commit comes after every event the audio before it caused
    assert not rt.of("input_audio_buffer.speech_started")  # manual: no turn detection
    await rt.conn.response.create()
    done = await rt.wait("response.done")
    assert done.response.status == "completed" and rt.of("response.output_audio.delta")
    (created,) = rt.of("response.created")  # a commit is not a request for an answer: the one answer is ours
    assert created.response.id == done.response.id

    await rt.conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
    await rt.wait("session.updated", 2)
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "What is two plus two?"}]})  # fmt: skip
    added = await rt.wait("conversation.item.done", 3)
    assert added.item.role == "user" and added.item.content[0].text == "What is two plus two?"
    audio_before = len(rt.of("response.output_audio.delta"))
    await rt.conn.response.create()
    done = await rt.wait("response.done", 2)
    text = rt.of("response.output_text.done")[0].text
    assert done.response.status == "completed" and text.strip()
    usage = done.response.usage  # the engine's counts: the conversation so far came from the cache
    assert usage.output_tokens >= 1 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.input_token_details.cached_tokens < usage.input_tokens
    assert text == "".join(e.delta for e in rt.of("response.output_text.delta"))
    assert len(rt.of("response.output_audio.delta")) == audio_before  # text only: nothing spoken


async def test_response_cancel_mid_answer(rt: Rt) -> None:
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Tell me a long story about a dragon."}]})  # fmt: skip
    await rt.conn.response.create()
    await rt.wait("response.output_audio.delta")
    await rt.conn.response.cancel()
    done = await rt.wait("response.done")
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"


async def test_barge_in_then_truncate_keeps_what_was_heard(rt: Rt, live_server) -> None:
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Tell me a long story about a dragon."}]})  # fmt: skip
    await rt.conn.response.create()
    first = await rt.wait("response.output_audio.delta")
    await rt.stream(spoken(corpus.REQUESTS[2]))  # the user talks over the answer
    cut = await rt.wait("response.done")
    assert cut.response.status == "cancelled" and cut.response.status_details.reason == "turn_detected"
    await rt.conn.conversation.item.truncate(item_id=first.item_id, content_index=0, audio_end_ms=400)
    truncated = await rt.wait("conversation.item.truncated")
    assert truncated.item_id == first.item_id and truncated.audio_end_ms == 400
    second = await rt.wait("response.done", 2)  # the interrupting question's answer
    assert second.response.status == "completed"
    session = live_server.state.sessions[rt.of("session.created")[0].session.id.removeprefix("sess_")]
    said = [text for role, text in session.history if role == "assistant"]
    full = rt.of("response.output_audio_transcript.done")[0].transcript
    assert len(said) == 2 and len(said[0].split()) < len(full.split())  # the first answer: only what was heard


async def test_the_answer_after_a_truncate_is_written_from_the_truncated_history(rt: Rt, live_server) -> None:
    """Turn detection that interrupts but does not answer by itself: barge in, truncate what was heard to 400 ms,
    then ask for an answer; the prompt that answer is written from holds the truncated reply, not the whole one."""
    detection = {"type": "server_vad", "create_response": False, "interrupt_response": True}
    await rt.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": detection}}})
    await rt.wait("session.updated")
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Tell me a long story about a dragon."}]})  # fmt: skip
    await rt.conn.response.create()
    first = await rt.wait("response.output_audio.delta")
    await rt.stream(spoken("Wait, stop."))  # the user talks over the answer
    cut = await rt.wait("response.done")
    assert cut.response.status == "cancelled"
    await rt.wait("conversation.item.input_audio_transcription.completed")
    heard = rt.of("response.output_audio_transcript.done")[0].transcript  # up to the barge-in
    await rt.conn.conversation.item.truncate(item_id=first.item_id, content_index=0, audio_end_ms=400)
    await rt.wait("conversation.item.truncated")

    llm = live_server.runtime.stages.llm
    prompts: list[list[tuple[str, str]]] = []
    generate = llm.generate

    def recording(session_id: str, messages: Any, **kw: Any) -> Any:
        prompts.append(list(messages))
        return generate(session_id, messages, **kw)

    llm.generate = recording
    try:
        await rt.conn.response.create()
        done = await rt.wait("response.done", 2)
    finally:
        del llm.generate
    assert done.response.status == "completed"
    # create_response false: the interruption was not answered by itself; the answers are the story's and ours
    assert [e.response.id for e in rt.of("response.created")] == [cut.response.id, done.response.id]
    (prompt,) = prompts
    said = [text for role, text in prompt if role == "assistant"]
    assert len(said) == 1 and len(said[0].split()) < len(heard.split()), (said, heard)  # 400 ms: a word or two
    assert heard.startswith(said[0]) and prompt[-1] == ("user", rt.of("conversation.item.input_audio_transcription.completed")[0].transcript)


async def test_instructions_a_voice_a_cleared_buffer_and_speech_that_does_not_interrupt(rt: Rt, live_server) -> None:
    """`instructions` become the system prompt of the next answer, a configured voice is taken, a cleared buffer
    holds nothing to commit, and with `interrupt_response: false` speech during an answer is heard
    (speech_started/stopped) but neither stops it nor becomes a turn (docs/realtime.md)."""
    session = live_server.state.sessions[rt.of("session.created")[0].session.id.removeprefix("sess_")]
    await rt.conn.session.update(session={"type": "realtime", "instructions": "You are a pirate. Answer in one line.",
                                          "audio": {"output": {"voice": "kal"}, "input": {"turn_detection": None}}})  # fmt: skip
    updated = await rt.wait("session.updated")
    assert updated.session.instructions == "You are a pirate. Answer in one line."
    assert updated.session.audio.output.voice == "kal" and session.voice_name == "kal"
    assert session.messages("Hello")[0] == ("system", "You are a pirate. Answer in one line.")

    await rt.stream(spoken("What is the capital of France?", tail_ms=200))
    await rt.conn.input_audio_buffer.clear()
    await rt.wait("input_audio_buffer.cleared")
    await rt.conn.input_audio_buffer.commit()
    empty = await rt.wait("error")
    assert empty.error.code == "input_audio_buffer_commit_empty"

    detection = {"type": "server_vad", "interrupt_response": False}
    await rt.conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": detection}}})
    await rt.wait("session.updated", 2)
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Tell me a long story about a ship."}]})  # fmt: skip
    await rt.conn.response.create()
    await rt.wait("response.output_audio.delta")
    await rt.stream(spoken("Wait, stop."))  # talks over the answer
    stopped = await rt.wait("input_audio_buffer.speech_stopped")
    done = await rt.wait("response.done")
    assert done.response.status == "completed"  # not interrupted
    assert rt.events.index(stopped) < rt.events.index(done)  # the speech was heard, and ended, during the answer
    # it was no turn: a turn's speech_stopped is followed at once by its commit, before anything else is sent
    assert not rt.of("input_audio_buffer.committed") and not rt.of("conversation.item.input_audio_transcription.completed")


async def test_bad_events_get_errors_and_the_session_goes_on(rt: Rt) -> None:
    await rt.conn.send({"type": "no.such.event", "event_id": "e1"})
    await rt.conn.send({"type": "input_audio_buffer.append", "audio": "***not base64***"})
    await rt.conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}})
    await rt.conn.conversation.item.truncate(item_id="item_nope", content_index=0, audio_end_ms=10)
    await rt.conn.response.cancel()
    await rt.conn.send({"type": "session.update", "session": {"type": "realtime", "instructions": 5}})
    errors = [await rt.wait("error", n) for n in range(1, 7)]
    assert errors[0].error.event_id == "e1" and errors[0].error.code == "unknown_event"
    assert [e.error.param for e in errors[1:4]] == ["audio", "session.audio.output.voice", "item_id"]
    assert errors[4].error.code == "response_cancel_not_active" and errors[5].error.param == "instructions"
    await rt.conn.conversation.item.create(item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Say hello."}]})  # fmt: skip
    await rt.conn.response.create()
    done = await rt.wait("response.done")
    assert done.response.status == "completed"


async def test_a_browser_s_key_subprotocol_and_a_wrong_key(live_server) -> None:
    """Browsers cannot set headers on a WebSocket: the key comes as a subprotocol, answered with `realtime`."""
    import json

    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{live_server.port}/v1/realtime?model=parley"
    async with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"
    async with connect(url, subprotocols=["realtime", "openai-insecure-api-key.wrong"]) as ws:  # type: ignore[list-item]
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["error"]["code"] == "invalid_api_key"
        await ws.wait_closed()
        assert ws.close_code == 1008


async def test_the_readme_example_runs(live_server) -> None:
    """The README's Realtime example, as printed there, against this server."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("<!-- realtime-example -->\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, "README.md (realtime example)", "exec"), namespace)
    answer = await namespace["ask"]("What is the capital of France?", f"{live_server.http}/v1", TOKEN)
    assert answer.strip()
