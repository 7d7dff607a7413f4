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

from voice.history import Change, History, replay


@dataclass(frozen=True)
class Saved:
    """A conversation's own state beside its history, as last written."""

    persona: str
    voice: str | None
    last_turn: int


class ConversationStore(Protocol):
    """Where conversations live: the history's changes appended as they happen, their own state saved as turns
    start, both read back to resume. Writes must not block (a database store queues them); reads may."""

    def append(self, conversation_id: str, change: Change) -> None: ...

    def load(self, conversation_id: str) -> Sequence[Change]: ...

    def save(self, conversation_id: str, state: Saved) -> None: ...

    def saved(self, conversation_id: str) -> Saved | None: ...

    def forget(self, conversation_id: str) -> None: ...

    def close(self) -> None:
        """Writes queued so far are done; nothing is written after."""
        ...


class MemoryStore:
    """In this process's memory: a conversation outlives its connection, not the server (parley.conversation_db's
    SqlStore outlives both)."""

    def __init__(self) -> None:
        self._logs: dict[str, list[Change]] = {}
        self._saved: dict[str, Saved] = {}

    def append(self, conversation_id: str, change: Change) -> None:
        self._logs.setdefault(conversation_id, []).append(change)

    def load(self, conversation_id: str) -> Sequence[Change]:
        return tuple(self._logs.get(conversation_id, ()))

    def save(self, conversation_id: str, state: Saved) -> None:
        self._saved[conversation_id] = state

    def saved(self, conversation_id: str) -> Saved | None:
        return self._saved.get(conversation_id)

    def forget(self, conversation_id: str) -> None:
        self._logs.pop(conversation_id, None)
        self._saved.pop(conversation_id, None)

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
        """It is over: gone from here and from the store."""
        self._open.pop(conversation_id, None)
        self.store.forget(conversation_id)
