"""/v1/realtime with G.711 (`audio/pcmu`, `audio/pcma`) in and out, through the official `openai` SDK's realtime
client against the real server: a spoken question sent as 8 kHz G.711 is heard and answered, and the answer's
audio deltas are G.711 at 8 kHz that the server's own recogniser reads back as the answer's words."""
from __future__ import annotations

import asyncio
import base64
import time
from contextlib import AsyncExitStack

import numpy as np
import pytest

from bench import corpus
from test_realtime import Rt, open_rt
from voice import codec
from voice.audio import resample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def spoken_g711(law: codec.Law, text: str) -> bytes:
    audio, rate = corpus.speak_piper(text, deterministic=True)
    speech16 = np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1500)])
    return codec.encode(law, resample(speech16, 16000, codec.G711_RATE))


async def stream(rt: Rt, data: bytes, chunk_ms: int = 20) -> None:
    """Append G.711 (a byte a sample at 8 kHz) paced like a phone line."""
    step = codec.G711_RATE * chunk_ms // 1000
    t0 = time.monotonic()
    for i in range(0, len(data), step):
        await rt.conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())
        ahead = (i + step) / codec.G711_RATE - (time.monotonic() - t0)
        if ahead > 0:
            await asyncio.sleep(ahead)


@pytest.mark.parametrize(("kind", "law"), [("audio/pcmu", "pcmu"), ("audio/pcma", "pcma")])
async def test_a_spoken_g711_question_gets_a_g711_answer(live_server, kind: str, law: codec.Law) -> None:
    async with AsyncExitStack() as stack:
        rt = await open_rt(live_server, stack)
        fmt = {"type": kind}
        await rt.conn.session.update(session={"type": "realtime", "audio": {
            "input": {"format": fmt, "turn_detection": {"type": "server_vad"}}, "output": {"format": fmt}}})  # fmt: skip
        updated = await rt.wait("session.updated")
        assert updated.session.audio.input.format.type == kind and updated.session.audio.output.format.type == kind
        question = corpus.REQUESTS[0]
        await stream(rt, spoken_g711(law, question))
        done = await rt.wait("response.done")
        heard = rt.of("conversation.item.input_audio_transcription.completed")[0].transcript
        assert corpus.wer(question, heard) <= 0.2, heard
        assert done.response.status == "completed"
        transcript = rt.of("response.output_audio_transcript.done")[0].transcript
        data = b"".join(base64.b64decode(e.delta) for e in rt.of("response.output_audio.delta") if e.response_id == done.response.id)
        assert len(data) > codec.G711_RATE // 2  # over half a second of speech, a byte a sample
        answer16 = resample(codec.decode(law, data), codec.G711_RATE, 16000)
        again = live_server.runtime.stages.transcriber.transcribe(answer16).text
        assert corpus.wer(transcript, again) <= 0.3, (transcript, again)
        # read as PCM16 24 kHz instead, the same bytes would be a third as long and noise: the format is real G.711
        assert len(data) / codec.G711_RATE == pytest.approx(len(answer16) / 16000, rel=0.01)


async def test_beta_format_names_and_a_wrong_rate(live_server) -> None:
    async with AsyncExitStack() as stack:
        rt = await open_rt(live_server, stack)
        await rt.conn.send({"type": "session.update", "session": {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}})
        updated = await rt.wait("session.updated")
        assert (updated.session.audio.input.format.type, updated.session.audio.output.format.type) == ("audio/pcmu", "audio/pcma")
        await rt.conn.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}}}})
        error = await rt.wait("error")
        assert error.error.code == "invalid_value" and "8000" in error.error.message
        await rt.conn.input_audio_buffer.append(audio=base64.b64encode(b"\xff" * 161).decode())  # odd: fine for G.711
        await rt.conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        await rt.wait("session.updated", 2)
        assert len(rt.of("error")) == 1
