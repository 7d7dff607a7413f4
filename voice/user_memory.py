"""What the assistant remembers about a user across conversations (a persona's `memory: true`): facts the user
states ("my name is Ana", "I'm vegetarian") are picked out by the engine after each of their turns, as JSON under a
grammar (which to remember, which known ones to forget: "forget that"), kept per user in the conversation store, and
placed in the system prompt of that user's next conversations.

The pure part (the request, reading its answer, the prompt's wording) is here beside the thin shell that runs it
after a reply ends, as background work the engine runs after everything a user waits for.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from llm_engine.constrain import Constraint, json_schema_grammar
from voice.facts import MAX_FACT_CHARS, Fact, FactStore
from voice.llm_bridge import LlmCall, LlmError, LlmFinish, LlmToken

log = logging.getLogger(__name__)
SETTLE_S = 10.0  # a closing session's last turns are read for facts for at most this long


def schema(facts: Sequence[Fact]) -> dict[str, Any]:
    """The answer's shape: which known notes go (their texts, nothing else), and the new ones."""
    known = [f.text for f in facts]
    forget: dict[str, Any] = {"type": "array", "items": {"enum": known}, "maxItems": len(known)} if known else {
        "type": "array", "maxItems": 0}
    return {
        "type": "object",
        "properties": {
            "forget": forget,
            "remember": {"type": "array", "items": {"type": "string", "maxLength": MAX_FACT_CHARS}, "maxItems": 3},
        },
        "required": ["forget", "remember"],
        "additionalProperties": False,
    }


SYSTEM = (
    "You keep a voice assistant's notes about its user. Each turn you get the notes and what the user said, and"
    ' answer with JSON only. "forget": the notes the user asks to forget or says are no longer true, copied; a new'
    ' fact forgets nothing else. "remember": new lasting facts the user states about themselves (name, family, pets,'
    ' home, work, likes, diet, plans), each written as "The user ...". Questions, requests and small talk give'
    ' nothing. Most turns give {"forget": [], "remember": []}.'
)
# (notes, what the user said, the answer): the few examples a small model needs to see the task done
EXAMPLES = (
    ((), "Hi, my name is Tom and I live in Oslo.", {"forget": [], "remember": ["The user's name is Tom.", "The user lives in Oslo."]}),
    (("The user's name is Tom.",), "What is the capital of Spain?", {"forget": [], "remember": []}),
    (("The user's name is Tom.", "The user has a cat.", "The user likes jazz."), "Please forget about my cat.",
     {"forget": ["The user has a cat."], "remember": []}),
    (("The user's name is Tom.",), "I started a new job as a nurse.", {"forget": [], "remember": ["The user works as a nurse."]}),
    (("The user's name is Tom.", "The user likes jazz."), "We got a puppy last week and I'm vegan now.",
     {"forget": [], "remember": ["The user has a puppy.", "The user is vegan."]}),
    (("The user's name is Tom.", "The user works as a nurse."), "What do you remember about me?", {"forget": [], "remember": []}),
    (("The user's name is Tom.", "The user lives in Oslo."), "I don't live in Oslo any more, I moved to Rome.",
     {"forget": ["The user lives in Oslo."], "remember": ["The user lives in Rome."]}),
)


class MemoryLlm(Protocol):
    def generate(self, session_id: str, messages: Sequence[tuple[str, str]], *, max_new_tokens: int,
                 constraint: Constraint | None, background: bool) -> LlmCall: ...  # fmt: skip

    def release(self, session_id: str) -> None: ...


def memory_prompt(facts: Sequence[Fact]) -> str:
    """What the system prompt says of them ('' for none)."""
    if not facts:
        return ""
    lines = "\n".join(f"- {f.text}" for f in facts)
    return (f"What you remember about the user from earlier conversations (use it where it helps; asked what you "
            f"remember, say it):\n{lines}")  # fmt: skip


def _turn(notes: Sequence[str], said: str) -> str:
    known = "\n".join(f"- {text}" for text in notes) or "(none)"
    return f"Notes:\n{known}\nThe user said: {json.dumps(said[:1000])}"


def extraction_request(facts: Sequence[Fact], said: str) -> list[tuple[str, str]]:
    """The request that reads one user turn for facts: the task, its examples, then this turn."""
    shown = [("system", SYSTEM)]
    for notes, example, answer in EXAMPLES:
        shown += [("user", _turn(notes, example)), ("assistant", json.dumps(answer))]
    return [*shown, ("user", _turn([f.text for f in facts], said))]


def read_answer(text: str, facts: Sequence[Fact]) -> tuple[list[str], list[int]]:
    """The engine's JSON -> (new facts' texts, the ids of known facts to forget); nothing from what does not parse."""
    try:
        answer: Any = json.loads(text)
    except ValueError:
        return [], []
    if not isinstance(answer, dict):
        return [], []
    by_text = {f.text.casefold(): f.id for f in facts}
    gone = [by_text[t.casefold()] for t in answer.get("forget", []) if isinstance(t, str) and t.casefold() in by_text]
    new = [t.strip()[:MAX_FACT_CHARS] for t in answer.get("remember", []) if isinstance(t, str) and t.strip()]
    return [t for t in dict.fromkeys(new) if t.casefold() not in by_text], list(dict.fromkeys(gone))


class UserMemory:
    """One session's view of its user's facts: `shown`, read as the session starts, is what its system prompt says
    (a fact learnt now changes no prompt before the next conversation: the engine's cache of this one stays); a fact
    the user asks to forget leaves it at once (`changed` is called: the prompt is warmed again)."""

    def __init__(self, key: str, owner: str, store: FactStore | None, llm: MemoryLlm, changed: Callable[[], None]) -> None:
        self.key = f"{key}/memory"  # the conversation's side slot for it
        self.owner, self.store, self.llm, self.changed = owner, store, llm, changed
        self.facts: tuple[Fact, ...] = ()  # all the user's, as last read
        self.shown: tuple[Fact, ...] = ()
        self._task: asyncio.Task[None] | None = None
        self._queued: list[str] = []  # what the user said in turns not yet read
        self._settled = False  # the session has closed

    @property
    def on(self) -> bool:
        """A user to remember (an owner) and somewhere to keep it."""
        return self.store is not None and bool(self.owner)

    async def load(self) -> None:
        if self.on:
            assert self.store is not None
            try:
                self.facts = self.shown = tuple(await asyncio.to_thread(self.store.facts, self.owner))
            except Exception as exc:  # the database is down: this conversation remembers nothing, and goes on
                log.error("user memory: the user's facts could not be read: %r", exc)

    def prompt(self) -> str:
        return memory_prompt(self.shown)

    def turn_ended(self, said: str) -> None:
        """A user turn's reply ended: what the user said is read for facts, after every request a user waits for."""
        if not self.on or self._settled or not said.strip():
            return
        self._queued.append(said)
        if self._task is None:  # its own task, not the session's: it outlives the session's end by settle()'s bound
            self._task = asyncio.get_running_loop().create_task(self._read_turns(), name=f"parley:{self.key}")

    async def settle(self, timeout_s: float = SETTLE_S) -> None:
        """The session ends (its close() calls this): the turns not read yet are read first, so a user who states a
        fact and hangs up is remembered, for at most `timeout_s`; then the reading stops."""
        self._settled = True  # a reply that ends after this (cancelled by the close) is not read
        task = self._task
        if task is None:
            return
        await asyncio.wait({task}, timeout=timeout_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _read_turns(self) -> None:
        try:
            while self._queued:
                said = self._queued.pop(0)
                try:
                    await self._read(said)
                except Exception as exc:  # a stage or the database failed: this turn is not read, the session goes on
                    log.warning("user memory: a turn was not read: %r", exc)
        finally:
            self._task = None
            await asyncio.to_thread(self.llm.release, self.key)

    async def _read(self, said: str) -> None:
        assert self.store is not None
        text: list[str] = []
        constraint = Constraint(json_schema_grammar(schema(self.facts)), close_at_limit=True)
        call = self.llm.generate(self.key, extraction_request(self.facts, said), max_new_tokens=120,
                                 constraint=constraint, background=True)  # fmt: skip
        async with aclosing(call):
            async for event in call:
                if isinstance(event, LlmToken):
                    text.append(event.text)
                elif isinstance(event, LlmError):
                    log.warning("user memory: %s", event.message)
                    return
                elif isinstance(event, LlmFinish):
                    break
        new, gone = read_answer("".join(text), self.facts)
        for fact in new:
            self.store.remember(self.owner, fact)
        if gone:
            self.store.forget_facts(self.owner, gone)
        if new or gone:
            log.info("user memory: %d remembered, %d forgotten", len(new), len(gone))
            self.facts = tuple(await asyncio.to_thread(self.store.facts, self.owner))
        if gone and any(f.id in gone for f in self.shown):
            self.shown = tuple(f for f in self.shown if f.id not in gone)
            self.changed()
