"""A dropped connection resumes (web/resume.py): the reconnect with session.ready's resume_token gets the same
conversation — history, turn ids, no second greeting — and a used or foreign token starts a new one, saying why."""
from __future__ import annotations

import pytest

from support.waiting import wait_for
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FACT = "My name is Ana and I am vegetarian."


async def _drop(c: Client) -> None:
    """The network goes: no close frame, the server sees an abnormal end (1006)."""
    c.ws.transport.abort()
    await c.wait_closed()


async def test_a_dropped_connection_resumes_its_conversation(live_server) -> None:
    async with Client(live_server.ws_url()) as first:
        ready = await first.start()
        assert ready["resumed"] is False and ready["resume_token"]
        await first.wait_for("response.done")  # the greeting
        await first.send(type="input.text", text=FACT)
        told = await first.wait_for("response.done", n=2)
        await _drop(first)
    sid, token = ready["session_id"], ready["resume_token"]

    async with Client(live_server.ws_url()) as second:
        again = await second.start(resume=token)
        assert again["resumed"] is True and again["session_id"] == sid
        assert again["resume_token"] not in (None, token)  # a new one: this one was good for one reconnect
        await second.send(type="input.text", text="What did I tell you about myself?")
        done = await second.wait_for("response.done")
        assert done["turn_id"] == told["turn_id"] + 1  # turn ids go on
        assert not second.of("error")
        assert {m.get("turn_id") for m in second.of("response.text.delta")} == {done["turn_id"]}  # no greeting
        session = live_server.state.sessions[sid]
        assert ("user", FACT) in session.history  # the answer's prompt held what was said before the drop
        replayed = await Client(live_server.ws_url()).__aenter__()
        try:  # the token it resumed with is spent
            fresh = await replayed.start(resume=token)
            err = await replayed.wait_for("error")
            assert err["code"] == "resume_failed" and not err["fatal"] and "unknown" in err["message"]
            assert fresh["resumed"] is False and fresh["session_id"] != sid
            assert (await replayed.wait_for("response.done"))["text"].startswith("Hi")  # a new conversation greets
        finally:
            await replayed.__aexit__()
    st = live_server.state  # closed with 1000: the conversation ends (once the server has seen the close)
    await wait_for(lambda: sid not in st.sessions and st.conversations.get(sid) is None, what="the conversation to end")


async def test_a_client_that_closes_normally_cannot_be_resumed(live_server) -> None:
    async with Client(live_server.ws_url()) as c:
        ready = await c.start()
        await c.wait_for("response.done")
    async with Client(live_server.ws_url()) as c:
        again = await c.start(resume=ready["resume_token"])
        assert again["resumed"] is False and (await c.wait_for("error"))["code"] == "resume_failed"


async def test_a_token_takes_over_a_connection_the_server_still_thinks_is_up(live_server) -> None:
    """A phone that changed networks reconnects before the server has seen its old socket die: the old connection
    is told and closed, and the new one carries the conversation on."""
    async with Client(live_server.ws_url()) as old, Client(live_server.ws_url()) as new:
        ready = await old.start()
        await old.wait_for("response.done")
        again = await new.start(resume=ready["resume_token"])
        assert again["resumed"] is True and again["session_id"] == ready["session_id"]
        err = await old.wait_for("error")
        assert err["code"] == "resumed_elsewhere" and err["fatal"]
        assert await old.wait_closed() == 1000
        await new.send(type="input.text", text="hello again")
        assert (await new.wait_for("response.done"))["turn_id"] > 0
