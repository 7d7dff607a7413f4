"""The transcripts a server keeps (web/conversations_api.py over the live server's SQLite store): a conversation is
listed while it goes on and after it ends, reads back as what was said, cannot be deleted under its connection, and
once deleted is gone — a held one's resume token with it."""
from __future__ import annotations

import httpx
import pytest

from server_config import TOKEN
from support.waiting import wait_for
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
QUESTION = "What is the capital of France?"


def _http(live_server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"})


async def test_a_conversation_is_listed_read_back_and_forgotten(live_server) -> None:
    st = live_server.state
    async with _http(live_server) as http:
        async with Client(live_server.ws_url()) as c:
            sid = (await c.start())["session_id"]
            greeting = await c.wait_for("response.done")
            await c.send(type="input.text", text=QUESTION)
            answer = await c.wait_for("response.done", n=2)
            listed = await _listed(http, sid)
            assert listed["open"] and listed["ended_s"] is None and listed["first_words"] == QUESTION
            await c.wait_for("turn.trace", turn_id=answer["turn_id"])  # recorded as the trace goes out
            read = (await http.get(f"/api/conversations/{sid}")).json()
            said = read["messages"]
            turns = {t["turn_id"]: t for t in read["turns"]}  # each finished turn's trace, in brief
            assert turns[answer["turn_id"]]["input"] == "text" and turns[answer["turn_id"]]["llm_ttft_ms"] > 0
            assert said == [{"role": "assistant", "content": greeting["text"]}, {"role": "user", "content": QUESTION},
                            {"role": "assistant", "content": answer["text"]}]  # fmt: skip
            refused = await http.delete(f"/api/conversations/{sid}")
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "in_use"
        await wait_for(lambda: st.conversations.get(sid) is None, what="the conversation to end")  # closed with 1000
        ended = await _listed(http, sid)  # ended, its transcript kept
        assert ended["ended_s"] is not None and not ended["open"] and ended["messages"] == 3
        assert (await http.delete(f"/api/conversations/{sid}")).json() == {"deleted": sid}
        assert (await http.get(f"/api/conversations/{sid}")).status_code == 404
        assert (await http.delete(f"/api/conversations/{sid}")).status_code == 404
        assert all(c["id"] != sid for c in (await http.get("/api/conversations")).json()["conversations"])
        assert (await httpx.AsyncClient(base_url=live_server.http).get("/api/conversations")).status_code == 401


async def test_deleting_a_held_conversation_spends_its_resume_token(live_server) -> None:
    st = live_server.state
    async with Client(live_server.ws_url()) as first:
        ready = await first.start()
        await first.wait_for("response.done")
        first.ws.transport.abort()  # dropped: held for a reconnect
        await first.wait_closed()
    sid = ready["session_id"]
    await wait_for(lambda: sid not in st.sessions and st.conversations.get(sid) is not None, what="the drop to be seen")
    async with _http(live_server) as http:
        assert (await http.delete(f"/api/conversations/{sid}")).status_code == 200
    assert st.conversations.get(sid) is None
    async with Client(live_server.ws_url()) as again:
        fresh = await again.start(resume=ready["resume_token"])
        assert fresh["resumed"] is False and (await again.wait_for("error"))["code"] == "resume_failed"


async def _listed(http: httpx.AsyncClient, sid: str) -> dict:
    rows = (await http.get("/api/conversations")).json()["conversations"]
    return next(r for r in rows if r["id"] == sid)
