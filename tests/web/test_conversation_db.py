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
from voice.conversation import Conversations, Saved, TurnSummary
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


def test_an_ended_conversation_keeps_its_transcript_until_it_is_forgotten(url: str) -> None:
    store = SqlStore(url)
    convs = Conversations(store)
    for cid, question in (("old", "What is the capital of France?"), ("new", "Set a timer for five minutes " * 5)):
        conv = convs.open(cid, persona="assistant", voice=None, max_chars=60, max_messages=100)
        conv.turned(1, "assistant", None)
        conv.memory.add_user(question)
        conv.memory.add("assistant", "Paris." if cid == "old" else "Done.")
        conv.memory.trim(force=True)  # the prompt loses the first exchange; the transcript keeps it
        conv.memory.add_user("Thanks.")
        time.sleep(0.01)  # updated_s orders the listing
    store.save_token("tok-old", "old", "auth", None)
    convs.end("old")
    listed = store.listing(10)
    assert [c.id for c in listed] == ["old", "new"]  # the one that ended last was written last
    old = listed[0]
    assert old.ended_s is not None and old.started_s is not None and old.messages == 3 and old.last_turn == 1
    assert old.first_words == "What is the capital of France?" and listed[1].ended_s is None
    assert listed[1].first_words.endswith("…") and len(listed[1].first_words) <= 80
    assert store.transcript("old") == [("user", "What is the capital of France?"), ("assistant", "Paris."), ("user", "Thanks.")]
    assert store.find_token("tok-old") is None  # ended: nothing to resume
    store.record_turn("old", TurnSummary(1, 5.0, "text", None, 180.5, ("llm_ttft",)))
    store.record_turn("old", TurnSummary(1, 6.0, "voice", 310.0, 120.0))  # the same turn again: the later trace
    assert store.turns("old") == (TurnSummary(1, 6.0, "voice", 310.0, 120.0),)
    convs.forget("old")
    assert store.transcript("old") is None and [c.id for c in store.listing(10)] == ["new"] and store.turns("old") == ()
    assert store.transcript("nobody") is None
    store.close()


def test_a_failing_database_drops_writes_with_an_error_and_raises_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "c.db").mkdir()  # the database's file is a directory: every write fails
    store = SqlStore(f"sqlite:///{tmp_path / 'c.db'}")  # starts all the same (the tables are made at first use)
    with caplog.at_level(logging.ERROR, logger="parley.conversation_db"):
        store.append("x", __import__("voice.history", fromlist=["Added"]).Added("user", "hi"))
        store.save("x", Saved("assistant", None, 1))
        assert store.flush()
    assert "writes dropped" in caplog.text
    with pytest.raises(Exception):
        store.listing(5)  # a read says the database failed (the API answers 503)
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


def test_a_database_an_older_parley_made_gains_the_new_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = sa.create_engine(url)
    with old.begin() as c:  # the first version's table: no started_s or ended_s
        c.execute(sa.text("CREATE TABLE conversations (id VARCHAR(64) PRIMARY KEY, persona VARCHAR(100) NOT NULL, "
                          "voice VARCHAR(100), last_turn INTEGER NOT NULL, updated_s FLOAT NOT NULL)"))  # fmt: skip
        c.execute(sa.text("INSERT INTO conversations VALUES ('c1', 'assistant', NULL, 4, 1.0)"))
    old.dispose()
    store = SqlStore(url)
    assert store.saved("c1") == Saved("assistant", None, 4)
    store.end("c1")
    assert [(c.id, c.started_s, c.ended_s is not None) for c in store.listing(5)] == [("c1", None, True)]
    store.close()


def test_a_users_facts_outlive_the_store_are_kept_per_user_and_forgotten_by_id(url: str) -> None:
    from voice.facts import MAX_FACTS

    store = SqlStore(url)
    store.remember("ana", "The user's name is Ana.")
    store.remember("ana", "The user is vegetarian.")
    store.remember("bo", "The user's name is Bo.")
    store.close()
    again = SqlStore(url)
    facts = again.facts("ana")
    assert [f.text for f in facts] == ["The user's name is Ana.", "The user is vegetarian."]
    again.forget_facts("ana", [facts[0].id])
    assert [f.text for f in again.facts("ana")] == ["The user is vegetarian."]
    assert [f.text for f in again.facts("bo")] == ["The user's name is Bo."]  # another user's are theirs
    for i in range(MAX_FACTS + 3):
        again.remember("bo", f"fact {i}")
    bo = [f.text for f in again.facts("bo")]
    assert len(bo) == MAX_FACTS and bo[-1] == f"fact {MAX_FACTS + 2}"  # the oldest went
    again.close()
