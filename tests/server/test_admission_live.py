"""Admission control on the real server (embedded models): while a conversation is being answered, the next session
is refused with `server_full` and the reason (/healthz shows why too, with the numbers admission went by); once the
conversation leaves, a new one is admitted.

The shared test server runs with admission off (its tests open sessions freely), so this test turns it on for its
own duration, as shipped except for one number: a newcomer is taken to cost more than the machine's cores
(`server.sessions_per_core` under one per core). That makes the capacity one conversation under either rule the
server may go by, and the test runs under each: the measured count (sessions_per_core x cores, at least one) and the
committed-work cost model (web/capacity.py: an empty server always takes one; a heavy newcomer does not fit beside
anyone), whatever load this busy machine measures. The limits that follow the machine's load now (queue waits, recent
voice-to-voice) are left off: whether they trigger depends on how busy this machine is; their arithmetic is tested in
tests/web."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from server_config import TOKEN
from support.waiting import wait_for
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def _health(live_server) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        return (await http.get("/healthz")).json()


async def _talking(live_server) -> Client:  # type: ignore[no-untyped-def]
    """An admitted session that has heard its greeting and whose typed question is being answered (audio arriving)."""
    c = Client(live_server.ws_url())
    await c.__aenter__()
    await c.start()
    greeting = await c.wait_for("response.done")
    await c.send(type="input.text", text="Tell me about the moon.")
    await c.wait_for("audio", turn_id=greeting["turn_id"] + 1)
    return c


@pytest.mark.parametrize("cost_model", [True, False], ids=["cost-model", "count"])
async def test_a_session_beyond_capacity_is_told_why_and_one_leaving_lets_the_next_in(  # type: ignore[no-untyped-def]
        live_server, monkeypatch, cost_model: bool) -> None:  # fmt: skip
    state = live_server.state
    cores = state.runtime.threads.cores if state.runtime.threads else 1
    server = state.cfg.server.model_copy(update={"admit_cost_model": cost_model, "sessions_per_core": 0.9 / cores,
                                                 "max_sessions": 4, "admit_max_wait_ms": 0.0, "admit_v2v_ratio": 0.0})
    monkeypatch.setattr(state, "cfg", state.cfg.model_copy(update={"server": server}))
    assert (await _health(live_server))["accepting"]  # an empty server takes a session under either rule

    talker = await _talking(live_server)
    try:
        health = await _health(live_server)
        assert health["sessions"] == 1 and not health["accepting"], health
        reason = health["refusing"]
        async with Client(live_server.ws_url()) as refused:
            err = await refused.wait_for("error")
            assert await refused.wait_closed() == 1013  # try again later
        assert err["code"] == "server_full" and err["fatal"] and not refused.of("session.ready"), err
        if cost_model:  # the committed-work cost model: what is committed, of the cores, in the reason
            assert 0 < health["committed_cores"] and f"of {cores:g} cores busy" in reason, health
            assert f"of {cores:g} cores busy" in err["message"] and err["retry_after_ms"] >= 1000, err
        else:  # the measured count
            assert health["capacity"] == 1 and "holds 1 conversations" in reason, health
            assert err["message"].startswith(reason), (err, reason)
    finally:
        await talker.__aexit__()

    # the conversation left: the next session is admitted and answered
    await wait_for(lambda: not state.sessions, 30, "the closed session to end")
    again = await _talking(live_server)
    await again.__aexit__()
