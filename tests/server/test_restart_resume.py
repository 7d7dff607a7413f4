"""A server killed with SIGKILL and started again resumes a conversation from its database (SQLite, and a real
PostgreSQL server): the client's resume token brings back the history, the turn counter and no second greeting."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.conversation_db import SqlStore
from server_config import TOKEN
from server_process import ServerProcess
from support.postgres import postgres_server
from support.waiting import wait_for
from voice.history import replay
from ws_client import open_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
FACT = "My name is Ana and I am vegetarian."


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'conversations.db'}"
        return
    with postgres_server() as url:
        yield url


async def test_a_killed_server_resumes_a_conversation_from_its_database(tmp_path: Path, storage_url: str) -> None:
    proc = ServerProcess(tmp_path / "srv", more={"storage": {"url": storage_url}}).start()
    db = SqlStore(storage_url)  # the test's own reader of the same database
    try:
        c = await open_session(proc.ws_url(TOKEN))
        ready = c.of("session.ready")[0]
        await c.wait_for("response.done")  # the greeting
        await c.send(type="input.text", text=FACT)
        told = await c.wait_for("response.done", n=2)
        sid = ready["session_id"]
        await wait_for(lambda: ("user", FACT) in replay(db.load(sid)) and len(replay(db.load(sid))) >= 3,
                       timeout_s=10, what="the writes to reach the database")  # fmt: skip
        proc.kill()  # SIGKILL: nothing is shut down cleanly
        await c.wait_closed()
        proc.start()
        again = await open_session(proc.ws_url(TOKEN), resume=ready["resume_token"])
        back = again.of("session.ready")[0]
        assert back["resumed"] is True and back["session_id"] == sid
        await again.send(type="input.text", text="What is my name?")
        done = await again.wait_for("response.done")
        assert done["turn_id"] > told["turn_id"] and not again.of("error")
        assert {m["turn_id"] for m in again.of("response.text.delta")} == {done["turn_id"]}  # no second greeting
        await wait_for(lambda: ("user", "What is my name?") in replay(db.load(sid)), timeout_s=10, what="the new turn's write")
        history = replay(db.load(sid))
        assert history.index(("user", FACT)) < history.index(("user", "What is my name?"))  # one conversation, in order
        await again.__aexit__()
    finally:
        proc.stop()
        db.close()
