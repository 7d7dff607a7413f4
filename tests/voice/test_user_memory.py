"""What the assistant remembers of a user across conversations (voice.user_memory): the pure reading of the
engine's answer, and a session on the fake engine — a fact read from the user's turn in the background, in the
system prompt of their next conversation, and gone from it at once when they ask to forget it."""
from __future__ import annotations

import json
from dataclasses import replace

from fakes import PERSONAS, FakeEngine, Harness
from support.waiting import wait_for
from voice.conversation import Conversations, MemoryStore
from voice.facts import Fact
from voice.user_memory import extraction_request, read_answer, schema

NAME = "The user's name is Ana."


def test_the_answer_is_read_as_new_facts_and_known_ones_to_forget() -> None:
    known = (Fact(7, NAME), Fact(9, "The user is vegetarian."))
    answer = json.dumps({"forget": ["the user is vegetarian."], "remember": [NAME, "The user has a dog.", "The user has a dog."]})
    assert read_answer(answer, known) == (["The user has a dog."], [9])  # known ones are not added twice
    assert read_answer("not json", known) == ([], []) and read_answer("[1]", known) == ([], [])
    assert schema(known)["properties"]["forget"]["items"] == {"enum": [NAME, "The user is vegetarian."]}
    assert schema(())["properties"]["forget"]["maxItems"] == 0  # nothing known: nothing to forget
    asked = extraction_request(known, "I moved to Rome.")
    assert asked[0][0] == "system" and asked[-1] == ("user", f'Notes:\n- {NAME}\n- The user is vegetarian.\nThe user said: "I moved to Rome."')


async def test_a_fact_is_remembered_for_the_next_conversation_and_forgotten_on_request() -> None:
    store = MemoryStore()
    personas = {**PERSONAS, "assistant": replace(PERSONAS["assistant"], memory=True)}
    remember = FakeEngine(reply_words=json.dumps({"forget": [], "remember": [NAME]}).split())
    first = Conversations(store).open("c1", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
    async with Harness(engine=remember, personas=personas, conversation=first, user="ana") as h:
        h.session.text_input("My name is Ana.")
        await h.wait_for("response.done", 1)
        await wait_for(lambda: [f.text for f in store.facts("ana")] == [NAME], what="the fact to be stored")
        assert NAME not in h.session.messages()[0][1]  # learnt now: this conversation's cached prompt stays as it was
    asks = [r for r in remember.requests if r.session_id == "c1/memory"]
    assert len(asks) == 1 and asks[0].background and asks[0].constraint is not None
    assert asks[0].messages[-1].content.endswith('The user said: "My name is Ana."')
    assert store.facts("bo") == ()  # another user's are theirs

    forget = FakeEngine(reply_words=json.dumps({"forget": [NAME], "remember": []}).split())
    second = Conversations(store).open("c2", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
    async with Harness(engine=forget, personas=personas, conversation=second, user="ana", warm_prompt=True) as h:
        await wait_for(lambda: NAME in h.session.messages()[0][1], what="the fact in the next conversation's prompt")
        h.session.text_input("Please forget my name.")
        await h.wait_for("response.done", 1)
        await wait_for(lambda: store.facts("ana") == (), what="the fact to be forgotten")
        await wait_for(lambda: NAME not in h.session.messages()[0][1], what="the fact to leave the prompt")
        prompt = [w for role, text in h.session.messages() for w in (role, *text.split())]
        await wait_for(lambda: forget.slots.get("s1") == prompt or forget.slots.get("c2") == prompt, what="the prompt warmed again")


async def test_a_session_without_a_user_or_a_persona_without_memory_reads_nothing() -> None:
    store = MemoryStore()
    engine = FakeEngine(reply_words=json.dumps({"forget": [], "remember": [NAME]}).split())
    memory = {**PERSONAS, "assistant": replace(PERSONAS["assistant"], memory=True)}
    for user, personas in (("", memory), ("ana", PERSONAS)):
        conv = Conversations(store).open(f"c-{user}", persona="assistant", voice=None, max_chars=10_000, max_messages=100)
        async with Harness(engine=engine, personas=personas, conversation=conv, user=user) as h:
            h.session.text_input("My name is Ana.")
            await h.wait_for("response.done", 1)
            await h.wait_for("turn.trace", 1)  # the reply's end is done with (that is where a read would start)
            assert h.session.user_memory._task is None and not h.session.user_memory._queued
    assert not [r for r in engine.requests if r.session_id.endswith("/memory")] and store.facts("ana") == ()
