"""A conversation outlives the connection that carries it (voice.conversation): a session detaches, another attaches
and goes on with the same history, turn ids and engine slot; its history is an append-only log a store replays."""
from __future__ import annotations

import pytest

from fakes import FakeEngine, Harness
from voice.conversation import AlreadyAttached, Conversations, MemoryStore
from voice.history import replay


async def test_a_conversation_survives_detach_and_attach() -> None:
    engine = FakeEngine()
    conversations = Conversations()
    conv = conversations.open("c1", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
    try:
        async with Harness(engine=engine, conversation=conv, keep_conversation=True) as first:
            assert first.session.session_id == "c1"  # the engine's slot, scheduler and spans go by the conversation
            asked = first.session.text_input("what is the weather like")
            said = (await first.wait_for("response.done"))["text"]
        assert not conv.attached and conv.last_turn == asked
        assert "c1" in engine.slots  # detached, not ended: the slot and its cached prompt stay
        async with Harness(engine=engine, conversation=conv) as second:
            assert list(second.session.history) == [("user", "what is the weather like"), ("assistant", said)]
            again = second.session.text_input("and tomorrow?")
            await second.wait_for("response.done")
            assert again == asked + 1  # turn ids go on: traces and marks of both connections never collide
            reply = engine.requests[-1]
            assert [m.content for m in reply.messages][-3:] == ["what is the weather like", said, "and tomorrow?"]
            assert engine.finished[-1].timings.reused_tokens > 0  # the first connection's cache, taken up
        assert "c1" not in engine.slots  # closed without keeping it: the slot is freed
        assert [m for m in replay(conversations.store.load("c1"))] == list(conv.memory.messages)
    finally:
        engine.stop()


async def test_one_connection_at_a_time_carries_a_conversation() -> None:
    conv = Conversations().open("c2", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
    async with Harness(conversation=conv):
        with pytest.raises(AlreadyAttached):
            Harness(conversation=conv)
    assert not conv.attached


def test_a_conversation_resumes_from_its_store_and_an_ended_one_is_gone() -> None:
    store = MemoryStore()
    old = Conversations(store)
    conv = old.open("c3", persona="assistant", voice="kal", max_chars=10_000, max_messages=100)
    conv.memory.add_user("hello")
    conv.memory.add("assistant", "Hi.")
    conv.turned(4, "assistant", "kal")
    again = Conversations(store).open("c3", persona="other", voice=None, max_chars=10_000, max_messages=100, resume=True)
    assert again.memory.messages == (("user", "hello"), ("assistant", "Hi."))
    assert (again.persona, again.voice, again.last_turn) == ("assistant", "kal", 4)  # as saved, not as asked
    old.end("c3")
    assert old.get("c3") is None and store.load("c3") == ()
