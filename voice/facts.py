"""A user's facts as the conversation stores keep them (voice.user_memory picks them out and uses them)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

MAX_FACTS = 30  # kept per user (the oldest go first): what fits a system prompt
MAX_FACT_CHARS = 200


@dataclass(frozen=True)
class Fact:
    id: int
    text: str


@runtime_checkable
class FactStore(Protocol):
    """Where users' facts live (parley.conversation_db.SqlStore, voice.conversation.MemoryStore), by owner: the
    user's id under its auth token."""

    def facts(self, owner: str) -> Sequence[Fact]:
        """Oldest first (a read that may wait)."""
        ...

    def remember(self, owner: str, text: str) -> None: ...

    def forget_facts(self, owner: str, ids: Sequence[int]) -> None: ...
