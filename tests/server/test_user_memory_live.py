"""A persona with `memory: true` on the default model (the 0.5B), through a real server and its SQLite store: a fact
the user states in one conversation is read from their turn, answered from in their next conversation, and gone
when they ask to forget it. Another user (another `user` id) is told nothing of it."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from parley.conversation_db import SqlStore
from server_config import TOKEN
from server_process import ServerProcess
from support.waiting import wait_for
from ws_client import open_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _owner(user: str) -> str:
    return hashlib.sha256(f"{TOKEN}\n{user}".encode()).hexdigest()


async def _ask(proc: ServerProcess, user: str, *questions: str) -> list[str]:
    c = await open_session(proc.ws_url(TOKEN), user=user)
    try:
        await c.wait_for("response.done")  # the greeting
        answers = []
        for i, q in enumerate(questions):
            await c.send(type="input.text", text=q)
            answers.append((await c.wait_for("response.done", n=i + 2, timeout_s=120))["text"])
        return answers
    finally:
        await c.__aexit__()


async def test_a_fact_is_remembered_in_the_next_conversation_and_forgotten_on_request(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'conversations.db'}"
    proc = ServerProcess(tmp_path / "srv", more={"storage": {"url": db}, "models": {"llm": {"source": "embedded"}}})
    persona = proc.root / "configs" / "personas" / "assistant.yaml"
    persona.write_text(yaml.safe_dump({**yaml.safe_load(persona.read_text()), "memory": True}))
    store = SqlStore(db)
    proc.start()
    try:
        await _ask(proc, "ana", "Hi! My name is Ana.")
        await wait_for(lambda: any("Ana" in f.text for f in store.facts(_owner("ana"))), timeout_s=120,
                       what="the name among Ana's facts")  # fmt: skip
        (answer,) = await _ask(proc, "ana", "What is my name?")
        assert "Ana" in answer, answer
        (other,) = await _ask(proc, "bo", "What is my name?")  # another user
        assert "Ana" not in other and store.facts(_owner("bo")) == (), other
        await _ask(proc, "ana", "Please forget my name.")
        await wait_for(lambda: not any("Ana" in f.text for f in store.facts(_owner("ana"))), timeout_s=120,
                       what="the name to be forgotten")  # fmt: skip
    finally:
        proc.stop()
        store.close()
