"""A conversation apart from the connection that carries it: its id (what the engine's slot, the scheduler, admission
and the spans are keyed by), its history as an append-only log of frozen changes behind a store, its persona and voice,
and its turn counter. A connection's session attaches to it and detaches from it; the conversation, its history and its
engine slot stay until whoever owns it (the server's `Conversations`) ends it.

Pure and synchronous: no asyncio, no sockets. The store here keeps the log in memory; a database behind the same
protocol is what lets a conversation outlive the process.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from voice.history import Change, History, Message, replay, transcript
from voice.facts import MAX_FACTS, Fact


@dataclass(frozen=True)
class Saved:
    """A conversation's own state beside its history, as last written."""

    persona: str
    voice: str | None
    last_turn: int


@dataclass(frozen=True)
class Listed:
    """One conversation as a list of them shows it (times wall-clock seconds; None where the store keeps no clock)."""

    id: str
    persona: str
    last_turn: int
    messages: int  # said in all, trimmed ones included
    first_words: str  # the user's first message, shortened
    started_s: float | None = None
    updated_s: float | None = None
    ended_s: float | None = None  # None: open (carried by a connection, or held for a reconnect)


@dataclass(frozen=True)
class TurnSummary:
    """What a finished turn's trace says in brief, kept beside the transcript (the whole trace is in the trace log)."""

    turn_id: int
    at_s: float  # wall-clock time it ended
    input: str  # voice | text | greeting ...
    voice_to_voice_ms: float | None
    llm_ttft_ms: float | None
    over_budget: tuple[str, ...] = ()


class ConversationStore(Protocol):
    """Where conversations live: the history's changes appended as they happen, their own state saved as turns
    start, both read back to resume. Writes must not block (a database store queues them); reads may."""

    def append(self, conversation_id: str, change: Change) -> None: ...

    def load(self, conversation_id: str) -> Sequence[Change]: ...

    def save(self, conversation_id: str, state: Saved) -> None: ...

    def saved(self, conversation_id: str) -> Saved | None: ...

    def end(self, conversation_id: str) -> None:
        """It is over (no reconnect can carry it on): a store that keeps transcripts keeps its own."""
        ...

    def forget(self, conversation_id: str) -> None:
        """All of it goes (the user asked)."""
        ...

    def listing(self, limit: int) -> Sequence[Listed]:
        """The newest `limit` conversations it keeps, newest first (a read that may wait)."""
        ...

    def record_turn(self, conversation_id: str, turn: TurnSummary) -> None: ...

    def turns(self, conversation_id: str) -> Sequence[TurnSummary]:
        """Its turns' summaries, in order (a read that may wait)."""
        ...

    def transcript(self, conversation_id: str) -> Sequence[Message] | None:
        """Everything said in it, trimmed messages included; None when it keeps no such conversation."""
        ...

    def close(self) -> None:
        """Writes queued so far are done; nothing is written after."""
        ...


class MemoryStore:
    """In this process's memory: a conversation outlives its connection, not the server (parley.conversation_db's
    SqlStore outlives both)."""

    def __init__(self) -> None:
        self._logs: dict[str, list[Change]] = {}
        self._saved: dict[str, Saved] = {}
        self._turns: dict[str, list[TurnSummary]] = {}
        self._facts: dict[str, list[Fact]] = {}  # users' facts (voice.user_memory)
        self._fact_ids = 0

    def append(self, conversation_id: str, change: Change) -> None:
        self._logs.setdefault(conversation_id, []).append(change)

    def load(self, conversation_id: str) -> Sequence[Change]:
        return tuple(self._logs.get(conversation_id, ()))

    def save(self, conversation_id: str, state: Saved) -> None:
        self._saved[conversation_id] = state

    def saved(self, conversation_id: str) -> Saved | None:
        return self._saved.get(conversation_id)

    def end(self, conversation_id: str) -> None:
        self.forget(conversation_id)  # memory keeps no transcripts: a server's own memory is not an archive

    def forget(self, conversation_id: str) -> None:
        self._logs.pop(conversation_id, None)
        self._saved.pop(conversation_id, None)
        self._turns.pop(conversation_id, None)

    def record_turn(self, conversation_id: str, turn: TurnSummary) -> None:
        self._turns.setdefault(conversation_id, []).append(turn)

    def turns(self, conversation_id: str) -> Sequence[TurnSummary]:
        return tuple(self._turns.get(conversation_id, ()))

    def listing(self, limit: int) -> Sequence[Listed]:
        ids = list(dict.fromkeys([*self._logs, *self._saved]))[::-1][:limit]
        return [listed(i, self._saved.get(i), transcript(self._logs.get(i, ()))) for i in ids]

    def transcript(self, conversation_id: str) -> Sequence[Message] | None:
        if conversation_id not in self._logs and conversation_id not in self._saved:
            return None
        return transcript(self._logs.get(conversation_id, ()))

    def facts(self, owner: str) -> Sequence[Fact]:
        return tuple(self._facts.get(owner, ()))

    def remember(self, owner: str, text: str) -> None:
        self._fact_ids += 1
        kept = [*self._facts.get(owner, ()), Fact(self._fact_ids, text)]
        self._facts[owner] = kept[-MAX_FACTS:]

    def forget_facts(self, owner: str, ids: Sequence[int]) -> None:
        self._facts[owner] = [f for f in self._facts.get(owner, ()) if f.id not in ids]

    def close(self) -> None:
        pass


class AlreadyAttached(Exception):
    """A second connection tried to carry a conversation one already carries."""


@dataclass
class Conversation:
    id: str
    memory: History
    persona: str  # the persona's name
    voice: str | None = None  # a voice that overrides the persona's
    last_turn: int = 0  # the newest turn id handed out: the next connection goes on from it
    store: ConversationStore | None = None  # where its state is saved as turns start (its history logs there itself)
    attached: bool = field(default=False, init=False)

    @classmethod
    def open(
        cls, conversation_id: str, store: ConversationStore, *, persona: str, voice: str | None = None,
        max_chars: int, max_messages: int, resume: bool = False,
    ) -> Conversation:  # fmt: skip
        """A conversation logged to `store`: new (nothing read), or with `resume` what the store holds of it (its
        history, persona, voice and turn counter; a read that may wait on the store)."""
        messages, last_turn = [], 0
        if resume:
            messages = replay(store.load(conversation_id))
            saved = store.saved(conversation_id)
            if saved is not None:
                persona, voice, last_turn = saved.persona, saved.voice, saved.last_turn
        memory = History(max_chars, max_messages, messages=messages, sink=lambda c: store.append(conversation_id, c))
        return cls(conversation_id, memory, persona, voice, last_turn, store)

    def turned(self, turn_id: int, persona: str, voice: str | None) -> None:
        """A turn starts: its id and who speaks are saved (a store queues the write), so a restart goes on from here."""
        self.last_turn = max(self.last_turn, turn_id)
        if self.store is not None:
            self.store.save(self.id, Saved(persona, voice, self.last_turn))

    def attach(self) -> None:
        """A connection carries it from now on: one at a time."""
        if self.attached:
            raise AlreadyAttached(f"conversation {self.id} is carried by another connection")
        self.attached = True

    def detach(self, persona: str, voice: str | None, last_turn: int) -> None:
        """The connection that carried it is gone; what it changed of the conversation's own state stays."""
        self.persona, self.voice, self.last_turn = persona, voice, max(self.last_turn, last_turn)
        self.attached = False
        if self.store is not None:
            self.store.save(self.id, Saved(persona, voice, self.last_turn))


class Conversations:
    """A server's conversations, open while a connection carries them (or until their owner ends them)."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        self.store: ConversationStore = store or MemoryStore()
        self._open: dict[str, Conversation] = {}

    def __len__(self) -> int:
        return len(self._open)

    def get(self, conversation_id: str) -> Conversation | None:
        return self._open.get(conversation_id)

    def open(
        self, conversation_id: str, *, persona: str, voice: str | None, max_chars: int, max_messages: int,
        resume: bool = False,
    ) -> Conversation:  # fmt: skip
        """The conversation of that id: the open one, else a new one (with `resume`: read back from the store, a
        read that may wait: off the event loop)."""
        conversation = self._open.get(conversation_id)
        if conversation is None:
            conversation = Conversation.open(conversation_id, self.store, persona=persona, voice=voice,
                                             max_chars=max_chars, max_messages=max_messages, resume=resume)  # fmt: skip
            self._open[conversation_id] = conversation
        return conversation

    def end(self, conversation_id: str) -> None:
        """It is over: gone from here; the store keeps its transcript if it keeps any."""
        self._open.pop(conversation_id, None)
        self.store.end(conversation_id)

    def forget(self, conversation_id: str) -> None:
        """The user asked: gone from here and from the store, transcript and all."""
        self._open.pop(conversation_id, None)
        self.store.forget(conversation_id)


def listed(conversation_id: str, saved: Saved | None, said: Sequence[Message], **times: float | None) -> Listed:
    """A conversation's line in a listing, from its saved state and its transcript."""
    first = next((text for role, text in said if role == "user"), "")
    words = first if len(first) <= 80 else first[:79].rsplit(" ", 1)[0] + "…"
    persona, last_turn = (saved.persona, saved.last_turn) if saved is not None else ("", 0)
    return Listed(conversation_id, persona, last_turn, len(said), words, **times)
