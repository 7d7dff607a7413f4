"""Admission control on the real server (embedded models): conversations are admitted up to the capacity the
config gives, each holding a spoken-reply turn, and the next session is refused with `server_full` and the reason,
which /healthz shows too; once one conversation leaves, a new one is admitted.

The shared test server runs with admission off (its tests open sessions freely), so this test turns it on for its
own duration: capacity from measurement (`server.sessions_per_core` x the cores). The two limits that follow the
machine's load now (queue waits, recent voice-to-voice) are left off here: whether they trigger depends on how busy
this machine is, and their arithmetic is tested in tests/web/test_admission.py."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from server_config import TOKEN
from support.waiting import wait_for
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CAPACITY = 2


async def _health(live_server) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        return (await http.get("/healthz")).json()


async def _conversation(live_server) -> Client:  # type: ignore[no-untyped-def]
    """An admitted session that has heard its greeting and had one typed turn answered."""
    c = Client(live_server.ws_url())
    await c.__aenter__()
    await c.start()
    greeting = await c.wait_for("response.done")
    await c.send(type="input.text", text="What is the capital of France?")
    done = await c.wait_for("response.done", turn_id=greeting["turn_id"] + 1)
    assert not done["interrupted"] and done["text"].strip(), done
    return c


async def test_sessions_are_admitted_up_to_capacity_and_the_next_is_told_why_not(live_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    state = live_server.state
    cores = state.runtime.threads.cores if state.runtime.threads else 1
    server = state.cfg.server.model_copy(update={
        "sessions_per_core": (CAPACITY + 0.5) / cores, "max_sessions": CAPACITY + 2,
        "admit_max_wait_ms": 0.0, "admit_v2v_ratio": 0.0})  # fmt: skip
    monkeypatch.setattr(state, "cfg", state.cfg.model_copy(update={"server": server}))
    health = await _health(live_server)
    assert health["accepting"] and health["capacity"] == CAPACITY, health

    admitted: list[Client] = []
    try:
        for _ in range(CAPACITY):
            admitted.append(await _conversation(live_server))
        health = await _health(live_server)
        assert health["sessions"] == CAPACITY and not health["accepting"], health
        reason = health["refusing"]
        assert reason and str(CAPACITY) in reason, health  # the capacity it goes by, in words

        async with Client(live_server.ws_url()) as refused:
            err = await refused.wait_for("error")
            assert err["code"] == "server_full" and err["fatal"], err
            assert err["message"].startswith(reason), (err, reason)  # the same reason, told to the client
            assert await refused.wait_closed() == 1013  # try again later
            assert not refused.of("session.ready")

        # one conversation leaves: the server takes a new one
        first = admitted.pop(0)
        await first.__aexit__()
        await wait_for(lambda: len(state.sessions) < CAPACITY, 30, "the closed session to end")
        admitted.append(await _conversation(live_server))
        assert (await _health(live_server))["sessions"] == CAPACITY
    finally:
        for c in admitted:
            await c.__aexit__()
