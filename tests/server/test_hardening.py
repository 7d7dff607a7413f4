"""A hostile or clumsy client against a real `parley serve` process on loopback: each way it once hurt other
users or the server, now answered with an error or a close while everyone else is served. Where a bystander's
latency matters it is compared with the same bystander's unloaded run in the same test."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from web import protocol as P

from bench import corpus
from server_config import TOKEN
from server_process import ServerProcess
from ws_client import Client, open_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LIMITS = dict(max_messages_per_s=100000, handshake_timeout_s=1.0, max_pending=3, header_timeout_s=1.0,
              max_connections=64, max_sessions=4)  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("hardened"), vad={"max_turn_ms": 4000}, **LIMITS).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return np.concatenate([corpus.silence(300), corpus._trim(corpus.speak("What is the capital of France?", "piper-steady"))])


async def started(server: ServerProcess) -> Client:
    return await open_session(server.ws_url(TOKEN), persona="concise")


async def still_answers(c: Client) -> None:
    n = len(c.of("session.updated"))
    await c.send(type="session.update", voice="espeak" if n % 2 == 0 else "joe")
    await c.wait_for("session.updated", n + 1, timeout_s=20)
    assert c.close_code is None


async def first_audio_after_typing(c: Client, text: str) -> float:
    """Seconds from sending `text` to the first audio of its reply."""
    n = len(c.of("response.done"))
    t0 = time.monotonic()
    await c.send(type="input.text", text=text)
    while True:
        done = await c.wait_for("response.done", n + 1, timeout_s=120)
        turn = done["turn_id"]
        audio = c.of("audio", turn)
        if audio:
            return audio[0]["at_s"] - t0
        n += 1


# -- 1. numbers JSON cannot hold; values out of range -----------------------------------------------------------


async def test_a_number_json_cannot_hold_is_an_error_and_the_session_goes_on(server: ServerProcess) -> None:
    c = await started(server)
    cases = [('{"type":"playback.mark","turn_id":1,"played_ms":1e999}', "invalid_message"),  # Infinity
             ('{"type":"playback.mark","turn_id":1,"played_ms":1e303}', "invalid_message"),
             ('{"type":"playback.mark","turn_id":1,"played_ms":NaN}', "bad_json"),
             ('{"type":"playback.mark","turn_id":' + "9" * 5000 + ',"played_ms":0}', "bad_json"),
             ('{"type":"playback.mark","turn_id":999,"played_ms":10}', "invalid_message"),  # a turn not begun
             ('{"type":"playback.mark","turn_id":1,"played_ms":999999}', "invalid_message")]  # past the audio sent
    for i, (raw, code) in enumerate(cases, 1):
        await c.ws.send(raw)
        err = await c.wait_for("error", i)
        assert (err["code"], err["fatal"]) == (code, False), raw[:80]
        assert len(err["message"]) < 300
    await still_answers(c)
    await c.__aexit__()
    traces = (await _http(server).get("/api/traces")).json()["traces"]
    assert all(abs(v) < 1e9 for t in traces for v in t["marks_ms"].values())


# -- 2. unbounded echo, a client that does not read ---------------------------------------------------------------


async def test_errors_never_echo_much_and_a_client_that_never_reads_is_closed(server: ServerProcess) -> None:
    c = await started(server)
    await c.send(type="x" * 900_000)
    err = await c.wait_for("error")
    assert err["code"] == "unknown_type" and len(err["message"]) < 300
    await c.__aexit__()
    # now a client that never reads (a raw socket with a tiny receive buffer): its errors fill the kernel's
    # buffers, then at most server.outbox's bound, and the server ends the connection instead of keeping them
    s = _raw_ws(server.port)
    s.sendall(_ws_frame(json.dumps({"type": "session.start", "protocol": 1, "sample_rate": 16000})))
    rss_before = server.rss_mb()
    s.settimeout(5)
    # Sent until the server gives up on it, bounded by time, not by a count: the rate limit lets 200 a second through
    # to make an error each, so how many frames it takes depends on how fast the server reads them (a fixed count
    # of 500,000 was sometimes read in full before the errors filled the buffers and the outbox)
    batch, deadline = _ws_frame('{"type":"what"}') * 100, time.monotonic() + 90.0
    with pytest.raises(OSError):  # the server stops reading, then resets the connection
        while time.monotonic() < deadline:
            s.sendall(batch)
    assert server.rss_mb() - rss_before < 100, server.rss_mb() - rss_before
    s.close()
    await still_serving(server)


def _raw_ws(port: int) -> socket.socket:
    """A WebSocket opened by hand (handshake only), so that nothing reads what the server sends."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())  # fmt: skip
    assert s.recv(4096).startswith(b"HTTP/1.1 101")
    return s


def _ws_frame(text: str) -> bytes:
    payload, mask = text.encode(), os.urandom(4)
    head = bytes([0x81, 0x80 | len(payload)]) if len(payload) < 126 else bytes([0x81, 0x80 | 126]) + struct.pack(">H", len(payload))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def still_serving(server: ServerProcess) -> None:
    """A fresh session starts normally."""
    async with Client(server.ws_url(TOKEN)) as c:
        assert (await c.start(persona="concise"))["protocol"] == 1


# -- 3. a history bomb ---------------------------------------------------------------------------------------------


async def test_a_history_bomb_does_not_starve_another_user(server: ServerProcess) -> None:
    bystander = await started(server)
    baseline = await first_audio_after_typing(bystander, "Say hello.")
    attacker = await started(server)
    t0 = time.monotonic()
    for i in range(300):  # 300 messages of 2,000 characters, about 20 a second as the finding sent them
        await attacker.send(type="input.text", text=f"{i} " + "tell me everything about the sea " * 60)
        await asyncio.sleep(0.05)
    flood_s = time.monotonic() - t0
    loaded = await first_audio_after_typing(bystander, "Say hello again.")
    print(f"\nbystander's first audio: {baseline:.2f} s alone, {loaded:.2f} s beside the bomb ({flood_s:.1f} s of it)")
    # Starved, the bystander waited for the whole flood's work (no reply within 30 s once: the engine thread fitted a
    # 300-message history). Served fairly, it waits behind at most the attacker's prompt being prefilled (~1-2 s of
    # a ~1,200-token history here), far less than the flood took to send, whatever the machine's speed.
    assert loaded <= max(15 * baseline, flood_s / 2), (baseline, loaded, flood_s)
    await still_answers(attacker)
    for c in (attacker, bystander):
        await c.__aexit__()


# -- 4. audio faster than real time --------------------------------------------------------------------------------


async def _spoken_turn_s(c: Client, question: np.ndarray) -> float:
    """Seconds from the last word of the streamed question to its final transcript (silence streams on meanwhile)."""
    n = len(c.of("transcript.final"))
    await c.stream(question)
    t_end = time.monotonic()
    await c.stream(corpus.silence(60000), until=lambda: len(c.of("transcript.final")) > n)
    return c.of("transcript.final")[n]["at_s"] - t_end


async def test_audio_faster_than_real_time_is_dropped_and_a_bystanders_turn_keeps_its_latency(server, question) -> None:
    bystander = await started(server)
    await bystander.wait_for("response.done")  # its greeting
    baseline = await _spoken_turn_s(bystander, question)
    attacker = await started(server)
    second = (corpus.white_noise(1000, level=0.3) * 32767).astype("<i2").tobytes()

    async def flood() -> None:
        for _ in range(250):  # 1 s messages at 50 times real time, for 5 s
            await attacker.ws.send(second)
            await asyncio.sleep(0.02)

    flooding = asyncio.create_task(flood())
    loaded = await _spoken_turn_s(bystander, question)
    await flooding
    print(f"\nbystander's final transcript: {baseline:.2f} s after its speech alone, {loaded:.2f} s beside the flood")
    assert loaded <= 5 * baseline + 0.5, (baseline, loaded)  # 52.9 s against 0.4 once
    overloaded = [e for e in attacker.of("error") if e["code"] == "overloaded"]
    assert overloaded and "dropped" in overloaded[-1]["message"]
    for c in (attacker, bystander):
        await c.__aexit__()


# -- 5. holding slots without a session ----------------------------------------------------------------------------


async def test_sockets_that_never_start_a_session_cannot_lock_others_out(server: ServerProcess) -> None:
    idlers = [Client(server.ws_url(TOKEN)) for _ in range(6)]
    for c in idlers:
        await c.__aenter__()

    async def poke() -> None:  # invalid messages, every 0.3 s: they must not count as activity
        while True:
            for c in idlers:
                if c.close_code is None:
                    await c.ws.send("{")
            await asyncio.sleep(0.3)

    poking = asyncio.create_task(poke())
    try:
        async with Client(server.ws_url(TOKEN)) as legit:
            ready = await legit.start()
            assert ready["protocol"] == 1
        for c in idlers:
            assert await c.wait_closed(timeout_s=10) == 1000
            assert c.of("error")[-1]["code"] == "handshake_timeout"
    finally:
        poking.cancel()
        for c in idlers:
            await c.__aexit__()


# -- 6. Host (DNS rebinding) and the token on every route ----------------------------------------------------------


def _http(server: ServerProcess, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", headers={"Authorization": f"Bearer {TOKEN}", **headers})


async def test_a_foreign_host_is_refused_and_the_token_guards_every_route_but_healthz(server: ServerProcess) -> None:
    evil = {"Host": f"evil.example:{server.port}"}
    async with _http(server, **evil) as http:
        for path in ("/api/traces", "/metrics", "/", "/healthz"):
            assert (await http.get(path)).status_code == 421, path
    with pytest.raises(InvalidStatus):
        async with connect(server.ws_url(TOKEN), additional_headers=evil, origin=f"http://evil.example:{server.port}"):  # type: ignore[arg-type]
            pass
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as anonymous:
        for path in ("/api/traces", "/metrics", "/api/personas", "/", "/app.js"):
            response = await anonymous.get(path)
            assert response.status_code == 401 and len(response.content) < 300, path
        assert (await anonymous.get("/healthz")).status_code == 200
        page = await anonymous.get(f"/?token={TOKEN}")
        assert page.status_code == 200 and "parley_token" in page.headers.get("set-cookie", "")
        assert (await anonymous.get("/app.js")).status_code == 200  # the page's own scripts: by the cookie


# -- 7. slow headers, too many connections, huge headers ----------------------------------------------------------


def _raw(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    return s


def _closed_by_server(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _asked(port: int) -> socket.socket:
    """A new connection with a whole GET /healthz sent on it (one dropped already says so to _answered)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    except (ConnectionResetError, BrokenPipeError):
        pass
    return s


def _answered(s: socket.socket) -> bool:
    """True when a response to the request sent on `s` comes back, False when the server closes it first."""
    try:
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                return False
            head += chunk
    except (ConnectionResetError, BrokenPipeError):
        return False
    return head.startswith(b"HTTP/1.1 ")


async def test_slow_headers_are_cut_off_and_connections_are_capped(server: ServerProcess) -> None:
    slow = [_raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(40)]  # never finished
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
        assert (await http.get("/healthz")).status_code == 200  # served beside them
    assert all(await asyncio.gather(*(asyncio.to_thread(_closed_by_server, s, 10) for s in slow)))
    huge = _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n")
    assert await asyncio.to_thread(_closed_by_server, huge, 10)
    many = [_asked(server.port) for _ in range(LIMITS["max_connections"] + 20)]
    # each asks for /healthz: one within the cap is answered, one past it was dropped at once and gets no word (told
    # apart by what each received, not by how soon: a kept one is also closed, 1 s on, by the header timeout)
    answered = await asyncio.gather(*(asyncio.to_thread(_answered, s) for s in many))
    print(f"\n{len(many)} connections past a cap of {LIMITS['max_connections']}: {answered.count(True)} answered")
    # 64 and 20 here; a connection of an earlier test the server has not finished yet may still hold a place
    assert answered.count(False) >= 20 and answered.count(True) >= LIMITS["max_connections"] // 2, answered
    for s in [*slow, huge, *many]:
        s.close()
    log = server.log_path.read_text()
    assert log.count("Traceback") <= 2, log[-3000:]


# -- 8. an utterance that never ends -------------------------------------------------------------------------------


_RUN_ON = (
    "and then the little brown dog ran all the way around the big red barn and back again while the old farmer sat"
    " in his chair by the door and watched the long slow river go by under the bridge near the mill"
)


async def test_an_utterance_ends_at_its_maximum_length(server: ServerProcess, question: np.ndarray) -> None:
    # One run-on sentence: no punctuation, so no pause a turn check could end it at (the longest silence in its
    # first 5 s is ~50 ms, under the 160 ms before a check); sentences ("Sure. It will be…") end early on a check.
    speech = corpus._trim(corpus.speak(_RUN_ON, "piper-steady"))  # ~9.5 s
    assert len(speech) > 16000 * 6
    assert max((b - a for a, b in corpus._gaps_ms(speech[: 16000 * 5], 16000)), default=0.0) < 120
    c = await started(server)
    await c.wait_for("response.done")
    await c.stream(speech[: 16000 * 6], until=lambda: bool(c.of("vad.speech_ended")))
    ended = await c.wait_for("vad.speech_ended")
    began = c.of("vad.speech_started", turn_id=ended["turn_id"])[0]
    # on the server's audio clock: the turn ended at the 4 s maximum (test config), not at the end of the speech
    # (when the message reached the client, how much more audio had been sent, is this machine's speed)
    assert ended["t_ms"] - began["t_ms"] <= 4000.0 + 100.0, (began, ended)
    trace = await c.wait_for("turn.trace", timeout_s=60)
    assert trace["turn"]["end"] == "max_length"
    await c.__aexit__()


# -- every bad message gets an error; the session lives on ------------------------------------------------------------

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats(allow_nan=True)
    | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)  # fmt: skip
_KNOWN = st.fixed_dictionaries(
    {"type": st.sampled_from(["session.start", "input.text", "response.cancel", "playback.mark", "session.update",
                               "nonsense", ""]) | st.text(max_size=20)},  # fmt: skip
    optional={"protocol": _VALUES, "sample_rate": _VALUES, "text": _VALUES, "turn_id": _VALUES, "played_ms": _VALUES,
              "persona": _VALUES, "voice": _VALUES, "extra": _VALUES},  # fmt: skip
)
# and now and then a field of any name, long ones too (a field name is echoed in `invalid_message`)
_MESSAGES = st.builds(lambda known, more: {**more, **known}, _KNOWN,
                      st.dictionaries(st.text(min_size=1, max_size=2000), _VALUES, max_size=1) | st.just({}))  # fmt: skip


def test_fuzzed_messages_get_an_error_or_an_answer_and_the_session_answers_after(server: ServerProcess) -> None:
    async def open_session() -> Client:
        c = await started(server)
        await c.wait_for("response.done")  # its greeting
        return c

    loop = asyncio.new_event_loop()
    c = loop.run_until_complete(open_session())
    seen = {"errors": 0}

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(msg=_MESSAGES)
    def case(msg: dict[str, object]) -> None:
        async def run() -> None:
            n = len(c.of("error"))
            raw = json.dumps(msg, allow_nan=True)
            await c.ws.send(raw)
            try:
                P.parse_text(raw)
            except P.ProtocolError:  # bad by the protocol's own rules: this one message gets its error
                await c.wait_for("error", n + 1, timeout_s=20)
            await still_answers(c)
            if msg["type"] not in ("response.cancel", "session.update") or set(msg) - {"type", "persona", "voice"}:
                seen["errors"] += len(c.of("error")) > n
            for m in c.of("error")[n:]:
                assert not m["fatal"] or m["code"] in ("bad_protocol_version", "already_started"), m
                assert len(m["message"]) < 400

        if msg.get("type") == "session.start" and msg.get("protocol") != 1:
            return  # a wrong protocol version ends the session on purpose (tested in test_bad_input)
        loop.run_until_complete(run())

    try:
        case()
        assert seen["errors"] > 50
    finally:
        loop.run_until_complete(c.__aexit__())
        loop.close()
