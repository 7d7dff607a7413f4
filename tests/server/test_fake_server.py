"""The socket layer on fake stages (no models): idle timeout, a typed turn end to end, the audio header and
input resampling. A real uvicorn on 127.0.0.1, started per module."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn

from fakes import FakeEngine, FakeTranscriber, FakeTts, FakeVad, tone
from server_config import write_test_config
from voice.llm_bridge import LlmBridge
from voice.session import Stages
from voice.turn import VoiceBinding
from web import runtime as rt
from web.app import create_app
from web.config import load_config
from ws_client import Client

pytestmark = pytest.mark.timeout(60)


def _serve(root: Path, **server: object) -> Iterator[str]:
    cfg = load_config(write_test_config(root, token=None, **server))
    engine = FakeEngine()
    tts = FakeTts(sample_rate=22050)
    stages = Stages(FakeVad, FakeTranscriber(), LlmBridge(engine), {name: VoiceBinding(tts) for name in cfg.voices})
    app = create_app(cfg, runtime=rt.Runtime(stages=stages, engine=engine))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    yield f"ws://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/ws"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory.mktemp("fake"))


@pytest.fixture
def impatient_server(tmp_path: Path) -> Iterator[str]:
    yield from _serve(tmp_path, idle_timeout_s=1.0)


@pytest.fixture
def strict_server(tmp_path: Path) -> Iterator[str]:
    # 20 messages a second: a flood exceeds it however slowly this machine sends
    yield from _serve(tmp_path, max_messages_per_s=20)


async def test_a_silent_client_is_closed_after_the_idle_timeout(impatient_server: str) -> None:
    async with Client(impatient_server) as c:
        await c.start(persona="concise")
        err = await c.wait_for("error", timeout_s=10)
        assert (err["code"], err["fatal"]) == ("idle_timeout", True)
        assert await c.wait_closed() == 1000


async def test_typed_turn_over_the_socket_with_headered_audio(fake_server: str) -> None:
    async with Client(fake_server) as c:
        ready = await c.start(persona="concise")
        assert ready["output_sample_rate"] == 22050
        greeting = await c.wait_for("response.done")
        await c.send(type="input.text", text="hello")
        turn = greeting["turn_id"] + 1
        done = await c.wait_for("response.done", turn_id=turn)
        trace = await c.wait_for("turn.trace", turn_id=turn)
        audio = c.of("audio", turn)
        assert [m["seq"] for m in audio] == list(range(len(audio)))
        samples = sum(len(m["pcm"]) // 2 for m in audio)
        # FakeTts speaks 150 ms a word at 22.05 kHz; the concise persona caps the reply at 20 words
        assert samples == pytest.approx(len(done["spoken_text"].split()) * 0.15 * 22050, rel=0.01)
        assert trace["input"] == "text" and "llm_ttft" in trace["stages_ms"]


async def test_message_flood_is_rate_limited_not_fatal(strict_server: str) -> None:
    async with Client(strict_server) as c:
        await c.start(persona="concise")
        for _ in range(200):
            await c.send(type="playback.mark", turn_id=99, played_ms=0)
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("rate_limited", False)
        assert len(c.of("error")) <= 2  # one error a second, not one per dropped message
        await asyncio.sleep(1.5)  # the bucket refills
        await c.send(type="session.update", voice="espeak")
        assert (await c.wait_for("session.updated"))["voice"] == "espeak" and c.close_code is None


async def test_48khz_input_is_resampled_to_16khz(fake_server: str) -> None:
    async with Client(fake_server) as c:
        await c.send(type="session.start", protocol=1, sample_rate=48000, persona="concise")
        ready = await c.wait_for("session.ready")
        assert ready["input_sample_rate"] == 48000
        audio = np.concatenate([tone(600, rate=48000), np.zeros(48000 * 7 // 10, dtype=np.float32)])
        for i in range(0, len(audio), 960):  # 20 ms at 48 kHz
            await c.ws.send((audio[i : i + 960] * 32767).astype("<i2").tobytes())
        ended = await c.wait_for("vad.speech_ended")
        assert ended["t_ms"] == pytest.approx(600.0, abs=20.0)  # the server's 16 kHz clock matches the 48 kHz stream
