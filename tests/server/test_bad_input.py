"""Bad input over a real socket: each case gets its `error` (or close code) and the server goes on serving."""
from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


async def assert_still_serving(live_server) -> None:
    """A fresh session starts normally after the bad one."""
    async with Client(live_server.ws_url()) as c:
        ready = await c.start(persona="concise")
        assert ready["protocol"] == 1 and ready["persona"] == "concise"


async def started(live_server) -> Client:
    c = Client(live_server.ws_url())
    await c.__aenter__()
    await c.start(persona="concise")
    return c


async def assert_session_goes_on(c: Client) -> None:
    await c.send(type="session.update", voice="espeak")
    updated = await c.wait_for("session.updated")
    assert updated["voice"] == "espeak" and c.close_code is None


async def test_odd_length_audio(live_server) -> None:
    c = await started(live_server)
    await c.ws.send(b"\x00" * 641)
    err = await c.wait_for("error")
    assert (err["code"], err["fatal"]) == ("bad_audio", False)
    await assert_session_goes_on(c)
    await c.__aexit__()
    await assert_still_serving(live_server)


async def test_audio_message_over_one_second(live_server) -> None:
    c = await started(live_server)
    await c.ws.send(b"\x00\x00" * 24000)  # 1.5 s at 16 kHz
    err = await c.wait_for("error")
    assert (err["code"], err["fatal"]) == ("audio_too_long", False)
    await assert_session_goes_on(c)
    await c.__aexit__()
    await assert_still_serving(live_server)


async def test_invalid_json(live_server) -> None:
    c = await started(live_server)
    await c.ws.send("{not json")
    err = await c.wait_for("error")
    assert (err["code"], err["fatal"]) == ("bad_json", False)
    await assert_session_goes_on(c)
    await c.__aexit__()
    await assert_still_serving(live_server)


async def test_unknown_type(live_server) -> None:
    c = await started(live_server)
    await c.send(type="response.create")
    err = await c.wait_for("error")
    assert (err["code"], err["fatal"]) == ("unknown_type", False) and "response.create" in err["message"]
    await assert_session_goes_on(c)
    await c.__aexit__()
    await assert_still_serving(live_server)


async def test_audio_before_session_start(live_server) -> None:
    async with Client(live_server.ws_url()) as c:
        await c.ws.send(b"\x00\x00" * 320)
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("not_started", False)
        ready = await c.start()  # the same connection can still start properly
        assert ready["session_id"]
    await assert_still_serving(live_server)


async def test_wrong_protocol_version(live_server) -> None:
    async with Client(live_server.ws_url()) as c:
        await c.send(type="session.start", protocol=2, sample_rate=16000)
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("bad_protocol_version", True)
        assert await c.wait_closed() == 1002
    await assert_still_serving(live_server)


async def test_unknown_persona(live_server) -> None:
    async with Client(live_server.ws_url()) as c:
        await c.send(type="session.start", protocol=1, sample_rate=16000, persona="pirate")
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("unknown_persona", False) and "assistant" in err["message"]
        ready = await c.start(persona="storyteller")
        assert (ready["persona"], ready["voice"]) == ("storyteller", "kal")
    await assert_still_serving(live_server)


async def test_fifty_megabyte_message_is_closed_with_1009(live_server) -> None:
    async with connect(live_server.ws_url(), max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "protocol": 1, "sample_rate": 16000, "persona": "concise"}))
        with pytest.raises(ConnectionClosed):
            await ws.send(b"\x00" * (50 * 1024 * 1024))
            while True:
                await asyncio.wait_for(ws.recv(), 30)
        assert ws.close_code == 1009
    await assert_still_serving(live_server)


async def test_wrong_token(live_server) -> None:
    async with Client(live_server.ws_url(token="nope")) as c:
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("unauthorized", True)
        assert await c.wait_closed() == 1008
    async with Client(live_server.ws_url(token=None), headers={"Authorization": "Bearer test-token"}) as c:
        assert (await c.start(persona="concise"))["session_id"]  # the header works as well as ?token=
    await assert_still_serving(live_server)


async def test_foreign_origin(live_server) -> None:
    async with Client(live_server.ws_url(), origin="http://evil.example") as c:
        err = await c.wait_for("error")
        assert (err["code"], err["fatal"]) == ("forbidden_origin", True)
        assert await c.wait_closed() == 1008
    async with Client(live_server.ws_url(), origin="http://localhost:8000") as c:
        assert (await c.start(persona="concise"))["session_id"]
    await assert_still_serving(live_server)


async def test_server_full(live_server) -> None:
    clients = [Client(live_server.ws_url()) for _ in range(live_server.cfg.server.max_sessions)]
    for c in clients:
        await c.__aenter__()
        await c.start(persona="concise")
    async with Client(live_server.ws_url()) as extra:
        err = await extra.wait_for("error")
        assert (err["code"], err["fatal"]) == ("server_full", True)
        assert "sessions" in err["message"] and err["retry_after_ms"] >= 1000  # why, and when to try again
        assert await extra.wait_closed() == 1013
    health = json.loads(await asyncio.to_thread(_get, live_server.http + "/healthz"))
    assert health["accepting"] is False and "sessions" in health["refusing"]
    assert 0 < health["committed_cores"] and health["cores"] >= 1  # the cost model's view: what the sessions commit
    for c in clients:
        await c.__aexit__()
    await asyncio.sleep(0.2)
    await assert_still_serving(live_server)
