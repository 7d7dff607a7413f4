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


class ConversationStore(Protocol):
    """Where conversations' logs live: appended to as the history changes, read back to resume."""

    def append(self, conversation_id: str, change: Change) -> None: ...

    def load(self, conversation_id: str) -> Sequence[Change]: ...

    def forget(self, conversation_id: str) -> None: ...


class MemoryStore:
    """Logs in this process's memory: a conversation outlives its connection, not the server."""

    def __init__(self) -> None:
        self._logs: dict[str, list[Change]] = {}

    def append(self, conversation_id: str, change: Change) -> None:
        self._logs.setdefault(conversation_id, []).append(change)

    def load(self, conversation_id: str) -> Sequence[Change]:
        return tuple(self._logs.get(conversation_id, ()))

    def forget(self, conversation_id: str) -> None:
        self._logs.pop(conversation_id, None)


class AlreadyAttached(Exception):
    """A second connection tried to carry a conversation one already carries."""


@dataclass
class Conversation:
    id: str
    memory: History
    persona: str  # the persona's name
    voice: str | None = None  # a voice that overrides the persona's
    last_turn: int = 0  # the newest turn id handed out: the next connection goes on from it
    attached: bool = field(default=False, init=False)

    @classmethod
    def open(
        cls, conversation_id: str, store: ConversationStore, *, persona: str, voice: str | None = None,
        max_chars: int, max_messages: int,
    ) -> Conversation:  # fmt: skip
        """A conversation with what `store` holds of it (nothing, for a new one), its changes logged there."""
        messages = replay(store.load(conversation_id))
        memory = History(max_chars, max_messages, messages=messages, sink=lambda c: store.append(conversation_id, c))
        return cls(conversation_id, memory, persona, voice)

    def attach(self) -> None:
        """A connection carries it from now on: one at a time."""
        if self.attached:
            raise AlreadyAttached(f"conversation {self.id} is carried by another connection")
        self.attached = True

    def detach(self, persona: str, voice: str | None, last_turn: int) -> None:
        """The connection that carried it is gone; what it changed of the conversation's own state stays."""
        self.persona, self.voice, self.last_turn = persona, voice, max(self.last_turn, last_turn)
        self.attached = False


class Conversations:
    """A server's conversations, open while a connection carries them (or until their owner ends them)."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        self.store: ConversationStore = store or MemoryStore()
        self._open: dict[str, Conversation] = {}

    def __len__(self) -> int:
        return len(self._open)

    def get(self, conversation_id: str) -> Conversation | None:
        return self._open.get(conversation_id)

    def open(self, conversation_id: str, *, persona: str, voice: str | None, max_chars: int, max_messages: int) -> Conversation:
        """The conversation of that id: the open one, else one resumed from the store (new when it holds nothing)."""
        conversation = self._open.get(conversation_id)
        if conversation is None:
            conversation = Conversation.open(conversation_id, self.store, persona=persona, voice=voice,
                                             max_chars=max_chars, max_messages=max_messages)  # fmt: skip
            self._open[conversation_id] = conversation
        return conversation

    def end(self, conversation_id: str) -> None:
        """It is over: gone from here and from the store."""
        self._open.pop(conversation_id, None)
        self.store.forget(conversation_id)
