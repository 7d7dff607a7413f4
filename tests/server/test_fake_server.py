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

from fakes import FakeEngine, FakeTranscriber, FakeTts, FakeTurnModel, FakeVad, quiet, tone
from server_config import write_test_config
from voice.llm_bridge import LlmBridge
from voice.stages import Stages
from voice.reply import VoiceBinding
from parley import runtime as rt
from web.app import create_app
from parley.config import load_config
from web.limits import RateLimiter, origin_allowed
from ws_client import Client

pytestmark = pytest.mark.timeout(60)


LOOPS: dict[str, asyncio.AbstractEventLoop] = {}  # ws url -> the server's event loop (to stall it)


def _serve(root: Path, **server: object) -> Iterator[str]:
    cfg = load_config(write_test_config(root, token=None, **server))
    engine = FakeEngine()
    tts = FakeTts(sample_rate=22050)
    stages = Stages(FakeVad, FakeTranscriber(), LlmBridge(engine), {name: VoiceBinding(tts) for name in cfg.voices},
                    turn_model=FakeTurnModel())  # fmt: skip
    app = create_app(cfg, runtime=rt.Runtime(stages=stages, engine=engine))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    loop: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loop.append(asyncio.get_running_loop())
        await server.serve()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    url = f"ws://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/ws"
    LOOPS[url] = loop[0]
    yield url
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


async def test_switching_persona_over_the_socket_greets_at_once(fake_server: str) -> None:
    async with Client(fake_server) as c:
        await c.start(persona="assistant")
        first = await c.wait_for("response.done")
        assert first["text"].startswith("Hi, I'm Parley")
        await c.send(type="session.update", persona="storyteller")
        updated = await c.wait_for("session.updated")
        greeting = await c.wait_for("response.done", turn_id=first["turn_id"] + 1)
        assert (updated["persona"], updated["voice"]) == ("storyteller", "kal")
        assert greeting["text"].startswith("Hello there, traveller") and not greeting["interrupted"]
        assert c.messages.index(updated) < c.messages.index(c.of("response.text.delta", greeting["turn_id"])[0])
        assert c.of("audio", greeting["turn_id"]) and not c.of("turn.trace")


async def test_message_flood_is_rate_limited_not_fatal(strict_server: str) -> None:
    async with Client(strict_server) as c:
        await c.start(persona="concise")
        for _ in range(200):
            await c.send(type="playback.mark", turn_id=0, played_ms=0)
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("rate_limited", False)
        assert len(c.of("error")) <= 2  # one error a second, not one per dropped message
        await asyncio.sleep(1.5)  # the bucket refills
        await c.send(type="session.update", voice="espeak")
        assert (await c.wait_for("session.updated"))["voice"] == "espeak" and c.close_code is None


@pytest.fixture
def audio_rate_server(tmp_path: Path) -> Iterator[str]:
    # 60 messages a second: a 20 ms microphone (50/s) is within it, a 3 s backlog (150) is over its 1 s burst
    yield from _serve(tmp_path, max_messages_per_s=60)


async def test_a_backlog_after_a_server_stall_is_accepted_and_a_flood_is_not(audio_rate_server: str) -> None:
    async with Client(audio_rate_server) as c:
        await c.start(persona="concise")
        await c.stream(quiet(500))
        LOOPS[audio_rate_server].call_soon_threadsafe(time.sleep, 3.0)  # the server stops reading for 3 s
        await c.stream(quiet(4000))  # a well-behaved microphone keeps sending through it, then after it
        await c.send(type="session.update", voice="espeak")
        assert (await c.wait_for("session.updated"))["voice"] == "espeak"
        assert not c.of("error"), c.of("error")
        for _ in range(600):  # then sustained abuse: ten seconds' worth at once
            await c.send(type="playback.mark", turn_id=0, played_ms=0)
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("rate_limited", False) and "dropped" in err["message"]
        assert c.close_code is None


async def test_a_page_served_by_parley_itself_is_allowed_on_any_port_and_foreign_origins_are_not(fake_server: str) -> None:
    port = int(fake_server.split(":")[2].split("/")[0])
    assert f"http://127.0.0.1:{port}" not in ("http://127.0.0.1:8000", "http://localhost:8000")  # not configured
    async with Client(fake_server, origin=f"http://127.0.0.1:{port}") as c:  # same origin as the Host header
        assert (await c.start(persona="concise"))["session_id"]
    for foreign in ("http://evil.example", f"http://evil.example:{port}", "http://127.0.0.1:1", f"https://127.0.0.1:{port + 1}"):
        async with Client(fake_server, origin=foreign) as c:
            err = await c.wait_for("error")
            assert (err["code"], err["fatal"]) == ("forbidden_origin", True), foreign
            assert await c.wait_closed() == 1008
    async with Client(fake_server, origin="http://localhost:8000") as c:  # the configured list still applies
        assert (await c.start(persona="concise"))["session_id"]


def test_origin_rules() -> None:
    allowed = ("http://localhost:8000",)
    assert origin_allowed(None, "127.0.0.1:9000", allowed)  # not a browser
    assert origin_allowed("http://localhost:8000", "127.0.0.1:9000", allowed)
    assert origin_allowed("http://LocalHost:9000", "localhost:9000", allowed)
    assert origin_allowed("http://parley.lan", "parley.lan:80", allowed)  # default ports
    assert origin_allowed("https://parley.lan", "parley.lan", allowed)
    assert not origin_allowed("http://parley.lan:9000", "parley.lan:9001", allowed)
    assert not origin_allowed("http://evil.example", "parley.lan", allowed)
    assert not origin_allowed("null", "parley.lan", allowed)
    assert not origin_allowed("http://parley.lan:99999", "parley.lan:99999", allowed)  # malformed port
    assert not origin_allowed("http://parley.lan", None, allowed)


def test_rate_limiter_keeps_a_stalls_credit_until_spent_but_caps_idle_accrual_at_the_burst() -> None:
    limiter = RateLimiter(50.0, burst_s=1.0, stall_s=10.0)
    # A clock 9 h past boot: there, differences of t lose their low bits and a gap of exactly 1/rate
    # earned 0.99999999..., which refused a steady 50/s once the bucket was empty.
    t = limiter.last = 33_367.63
    assert sum(limiter.allow(t) for _ in range(60)) == 50  # a 1 s burst, then refused
    t += 2.0  # two seconds without a read: 100 messages' worth arrive at once
    assert sum(limiter.allow(t) for _ in range(100)) == 100
    assert not limiter.allow(t)
    t += 60.0  # a long idle earns at most the stall cap (10 s worth) and the burst, not a minute's worth
    assert sum(limiter.allow(t) for _ in range(1000)) == 550
    # a steady 50/s is always allowed; 100/s is refused about half the time
    assert all(limiter.allow(t := t + 0.02) for _ in range(500))
    assert 400 <= sum(limiter.allow(t := t + 0.01) for _ in range(1000)) <= 600


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


def test_a_detection_that_needs_the_turn_model_is_refused_at_start_without_it(tmp_path: Path) -> None:
    cfg = load_config(write_test_config(tmp_path, token=None))
    assert cfg.vad.turn_detection == "combined"
    engine = FakeEngine()
    stages = Stages(FakeVad, FakeTranscriber(), LlmBridge(engine), {name: VoiceBinding(FakeTts()) for name in cfg.voices})
    try:
        with pytest.raises(RuntimeError, match="needs the turn model"):
            create_app(cfg, runtime=rt.Runtime(stages=stages, engine=engine))
    finally:
        engine.stop()


async def test_the_clients_own_playback_start_reaches_the_turns_trace(fake_server: str) -> None:
    """playback.mark's optional start_ms / underruns (docs/protocol.md, Client playback start): kept for the turn and
    written into its trace (the log, /api/traces); a bad value is refused like any bad field."""
    import json
    import urllib.request

    async with Client(fake_server) as c:
        greeting = await c.start(persona="concise") and await c.wait_for("response.done")
        turn = greeting["turn_id"] + 1
        await c.send(type="input.text", text="hello")
        await c.wait_for("audio", turn_id=turn)
        await c.send(type="playback.mark", turn_id=turn, played_ms=0, start_ms=12.34, underruns=1)
        await c.send(type="playback.mark", turn_id=turn, played_ms=100, start_ms=99.0, underruns=1)  # the first start counts
        sent = await c.wait_for("turn.trace", turn_id=turn)
        await c.send(type="playback.mark", turn_id=turn, played_ms=0, start_ms=-1)
        err = await c.wait_for("error")
        assert err["code"] == "invalid_message" and not err["fatal"]
    http = fake_server.replace("ws://", "http://").removesuffix("/ws")
    with urllib.request.urlopen(f"{http}/api/traces?limit=500", timeout=10) as r:
        traces = [t for t in json.loads(r.read())["traces"] if t["session_id"] == sent["session_id"] and t["turn_id"] == turn]
    assert [(t["client_playback_ms"], t["client_underruns"]) for t in traces] == [(12.3, 1)]
