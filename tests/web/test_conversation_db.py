"""Conversations in a real database (parley.conversation_db): SQLite and a real PostgreSQL server. What a history
logs there replays after the store is opened again (a restart); tokens and a conversation's own state come back;
forgetting removes all of it; a database that fails loses writes with a logged error, never a raise into a turn."""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.conversation_db import SqlStore, digest, open_store
from support.postgres import postgres_server
from voice.conversation import Conversations, Saved
from voice.history import replay


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def test_a_conversation_comes_back_whole_after_a_restart(url: str) -> None:
    store = SqlStore(url)
    conv = Conversations(store).open("r1", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
    conv.memory.add_user("My name is Ana.", voice_turn=1)
    conv.memory.add("assistant", "Nice to meet you, Ana.")
    conv.memory.add_user("I am vegetarian.")
    conv.memory.add("assistant", "Noted.")
    conv.memory.trim(force=True)
    conv.turned(3, "concise", "kal")
    store.save_token("tok", "r1", "auth", None)
    store.close()

    again = SqlStore(url)  # a new process
    back = Conversations(again).open("r1", persona="x", voice=None, max_chars=10_000, max_messages=100, resume=True)
    assert back.memory.messages == conv.memory.messages and len(back.memory.messages) == 2
    assert (back.persona, back.voice, back.last_turn) == ("concise", "kal", 3)
    back.memory.add_user("What do I eat?")  # a resumed log goes on where it was
    assert replay(again.load("r1")) == list(back.memory.messages)
    found = again.find_token("tok")
    assert found is not None and found.conversation_id == "r1" and found.auth_hash == digest("auth") and found.deadline_s is None
    again.hold_orphans(time.time() + 60)  # the next start: the connection that had it is gone
    assert again.find_token("tok").deadline_s is not None  # type: ignore[union-attr]
    again.forget("r1")
    assert again.load("r1") == () and again.saved("r1") is None and again.find_token("tok") is None
    again.close()


def test_a_failing_database_drops_writes_with_an_error_and_raises_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'c.db'}")
    store.engine.dispose()
    (tmp_path / "c.db").unlink()
    (tmp_path / "c.db").mkdir()  # the file is now a directory: every write fails
    with caplog.at_level(logging.ERROR, logger="parley.conversation_db"):
        store.append("x", __import__("voice.history", fromlist=["Added"]).Added("user", "hi"))
        store.save("x", Saved("assistant", None, 1))
        assert store.flush()
    assert "writes dropped" in caplog.text
    store.close()


def test_storage_urls_name_their_store(tmp_path: Path) -> None:
    from parley.config import ConfigError
    from voice.conversation import MemoryStore

    assert isinstance(open_store("memory"), MemoryStore)
    sql = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    assert isinstance(sql, SqlStore)
    sql.close()
    with pytest.raises(ConfigError, match="storage.url"):
        open_store("nosuchdb://x")
