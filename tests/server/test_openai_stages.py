"""The OpenAI-compatible stage routes (web.openai_api) with the real `openai` SDK as the client, on loopback:
chat completions streamed and whole, stop, max_tokens, usage, concurrent streams, a client that leaves mid-stream,
the token, transcription of a spoken clip and synthesized speech heard back. The stages app runs on the shared
live server's loaded models (another port, the same engine)."""
from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile as sf

from bench import corpus
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from in_thread import serve_in_thread
from server_config import TOKEN
from web.openai_api.app import create_stages_app

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip


@pytest.fixture(scope="module")
def stages_url(live_server) -> Iterator[str]:
    app = create_stages_app(live_server.cfg, runtime=live_server.runtime)
    with serve_in_thread(app, "stages-server") as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def client(stages_url) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stages_url, api_key=TOKEN, max_retries=0)


def in_process(engine, max_new: int, **sampling) -> str:
    msgs = tuple(ChatMessage(m["role"], m["content"]) for m in MESSAGES)
    req = GenerateRequest("in-process", msgs, SamplingParams(max_new_tokens=max_new, **sampling))
    text = engine.submit(req).collect()[1]
    engine.release("in-process")
    return text


async def test_chat_whole_and_streamed_equal_the_in_process_engine_greedy(client, live_server):
    expected = in_process(live_server.runtime.engine, 24)
    whole = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.object == "chat.completion"
    usage = whole.usage
    assert usage.prompt_tokens > 20 and 0 < usage.completion_tokens <= 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    stream = await client.chat.completions.create(model="any", messages=MESSAGES, max_completion_tokens=24,
                                                  temperature=0, stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == usage.completion_tokens


async def test_stop_and_max_tokens(client, live_server):
    free = in_process(live_server.runtime.engine, 24)
    stop = " " + free.split()[2]
    cut = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == free[: free.index(stop)] and cut.choices[0].finish_reason == "stop"
    short = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    listed = await client.models.list()
    assert [m.id for m in listed.data][0] == "parley-llm"


async def test_a_continued_conversation_reuses_the_cache_by_user_and_by_prefix(client):
    first = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=8, temperature=0, user="conv-1")
    more = [*MESSAGES, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Spain?"}]  # fmt: skip
    keyed = await client.chat.completions.create(model="any", messages=more, max_tokens=8, temperature=0, user="conv-1")
    assert keyed.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens - 5
    first_anon = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=8, temperature=0)
    anon = await client.chat.completions.create(model="any", messages=more, max_tokens=8, temperature=0)
    assert first_anon.choices[0].message.content == first.choices[0].message.content
    assert anon.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens - 5


async def slots_freed(engine, why: str, timeout_s: float = 10.0) -> None:
    """Until every engine slot is free (the engine thread frees a cancelled one between its steps); fails with
    `why` after timeout_s, a safety net rather than a speed bound."""
    deadline = time.monotonic() + timeout_s
    while any(s.busy for s in engine.slots.slots):
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.01)


async def test_four_concurrent_streams_and_a_client_that_leaves_frees_its_slot(client, live_server):
    engine = live_server.runtime.engine
    expected = in_process(engine, 16)

    async def one() -> str:
        stream = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=16, temperature=0, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert await asyncio.gather(*(one() for _ in range(4))) == [expected] * 4

    long = [{"role": "user", "content": "Write a very long story about a dragon."}]
    stream = await client.chat.completions.create(model="any", messages=long, max_tokens=400, temperature=0, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    assert any(s.busy for s in engine.slots.slots)
    await stream.close()  # the client leaves mid-stream
    await slots_freed(engine, "the slot of a stream whose client left is still busy")
    prompt = len(engine.tokenizer.apply_chat_template([ChatMessage("user", long[0]["content"])]))
    last = max(engine.slots.slots, key=lambda s: s.last_used)
    assert prompt <= len(last.tokens) < prompt + 100  # cancelled a few tokens in, not run to 400


async def test_a_remote_llm_reply_cancelled_mid_stream_frees_the_stage_server_s_slot(stages_url, live_server, monkeypatch):
    """A barge-in on a reply from a remote LLM (voice.remote.llm, as the session reads it): the reply's task is
    cancelled, closing the call closes the stream, and the stage server cancels the generation and frees its slot."""
    from contextlib import aclosing

    from voice.llm_bridge import LlmToken
    from voice.remote.client import RemoteSpec
    from voice.remote.llm import RemoteLlm

    monkeypatch.setenv("PARLEY_TEST_STAGES_KEY", TOKEN)
    llm = RemoteLlm(RemoteSpec(stages_url, api_key_env="PARLEY_TEST_STAGES_KEY"))
    engine = live_server.runtime.engine
    speaking = asyncio.Event()

    async def reply() -> None:
        call = llm.generate("barge-in", [("user", "Write a very long story about a dragon.")], max_new_tokens=400)
        async with aclosing(call):
            async for event in call:
                if isinstance(event, LlmToken):
                    speaking.set()

    task = asyncio.create_task(reply())
    await asyncio.wait_for(speaking.wait(), 60)
    assert any(s.busy for s in engine.slots.slots) and llm.active_slots() == 1
    task.cancel()  # the barge-in
    await asyncio.gather(task, return_exceptions=True)
    assert llm.active_slots() == 0
    await slots_freed(engine, "the stage server still generates a reply whose stream was closed")


async def test_a_wrong_token_and_bad_requests_are_answered_in_openai_s_shape(stages_url):
    wrong = openai.AsyncOpenAI(base_url=stages_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        await wrong.chat.completions.create(model="any", messages=MESSAGES)
    assert err.value.status_code == 401 and "token" in err.value.body["message"]
    ok = openai.AsyncOpenAI(base_url=stages_url, api_key=TOKEN, max_retries=0)
    for bad, param in (({"messages": []}, "messages"), ({"messages": MESSAGES, "n": 2}, "n"),
                       ({"messages": MESSAGES, "temperature": 9}, "temperature")):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            await ok.chat.completions.create(model="any", **bad)
        assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as err:
        await ok.chat.completions.create(model="any", messages=[{"role": "user", "content": "word " * 5000}])
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        await ok.audio.speech.create(model="tts-1", voice="nobody", input="Hello.")
    assert "unknown voice" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        await ok.audio.transcriptions.create(model="whisper-1", file=("x.wav", b"not audio"))


async def test_transcription_of_a_spoken_clip(client):
    said = corpus.REQUESTS[:3]
    heard = []
    for text in said:
        audio, rate = corpus.speak_piper(text, deterministic=True)
        buf = io.BytesIO()
        sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
        result = await client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", buf.getvalue()))
        heard.append(result.text)
    assert corpus.wer(said, heard) <= 0.1, heard
    verbose = await client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", buf.getvalue()),
                                                       response_format="verbose_json")  # fmt: skip
    assert verbose.text == heard[-1] and verbose.duration == pytest.approx(len(audio) / rate, abs=0.05)
    plain = await client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", buf.getvalue()), response_format="text")
    assert isinstance(plain, str) and plain.strip() == heard[-1].strip()


async def test_sampling_with_a_seed_repeats_and_top_p_one_token_is_greedy(client):
    """temperature/top_p/seed reach the engine's sampler: the same seed gives the same sampled reply; a top_p so
    small that only the likeliest token is left gives the greedy reply whatever the temperature."""
    sampled = [await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=16, temperature=1.2,
                                                    seed=seed) for seed in (7, 7, 8, 9, 10)]  # fmt: skip
    texts = [r.choices[0].message.content for r in sampled]
    assert texts[0] == texts[1], texts
    assert len(set(texts)) > 1, texts  # the seed is what repeats it: other seeds sample other replies
    greedy = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=16, temperature=0)
    narrow = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=16, temperature=1.5,
                                                  top_p=1e-6, seed=3)  # fmt: skip
    assert narrow.choices[0].message.content == greedy.choices[0].message.content


async def test_speech_is_streamed_at_24_khz_and_heard_back(client):
    text = corpus.REPLIES[1]
    pieces = []
    async with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=text,
                                                                  response_format="pcm") as response:  # fmt: skip
        async for piece in response.iter_bytes():
            pieces.append(piece)
    pcm = b"".join(pieces)
    assert len(pieces) > 1 and len(pcm) % 2 == 0
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    assert 2.0 < len(audio) / 24000 < 10.0  # a sentence at 24 kHz, not at 22.05 or 16
    transcript = await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", _wav(audio, 24000)))
    assert corpus.wer(text, transcript.text) <= 0.1, transcript.text
    wav = await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="wav")
    decoded, rate = sf.read(io.BytesIO(wav.content))
    assert rate == 24000 and len(decoded) > 0.3 * rate
    fast = await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="wav", speed=2.0)
    quick, _ = sf.read(io.BytesIO(fast.content))
    assert len(quick) < 0.75 * len(decoded), (len(quick), len(decoded))  # speed 2 speaks it faster


def _wav(audio: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
