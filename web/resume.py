"""Resume tokens: the secret a client keeps to carry its conversation on after its connection drops.

Each started session gets a fresh token (`session.ready`'s `resume_token`); the conversation's previous token stops
working then, so a token is good for one reconnect. A connection that drops (the client did not close it with 1000)
leaves its conversation held for `window_s`; a session.start with the token within that time (or before the server
has seen the drop at all), and with the same auth token as the one it was issued to, gets the conversation back.
Pure but for a log of its tokens (a database, so a restarted server resumes them); the caller passes the time, wall
clock time (it must mean the same after a restart).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Protocol


class UnknownToken(ValueError):
    """Not a token this process knows (used, or issued before a restart: the database may know it)."""


class TokenLog(Protocol):
    """Where tokens outlive the process (parley.conversation_db.SqlStore): writes queued, never blocking."""

    def save_token(self, token: str, conversation_id: str, auth: str, deadline_s: float | None) -> None: ...

    def hold_token(self, conversation_id: str, deadline_s: float) -> None: ...


@dataclass
class _Held:
    conversation_id: str
    auth: str  # the bearer token the connection that got it used ("" when the server has none)
    deadline_s: float | None = None  # None: its connection is still up (not resumable until it drops)


class ResumeTokens:
    def __init__(self, window_s: float, max_held: int = 256, log: TokenLog | None = None) -> None:
        self.window_s = window_s
        self.log = log
        self.max_held = max_held  # conversations held for a reconnect at most: past it the oldest end (memory)
        self._by_token: dict[str, _Held] = {}
        self._token_of: dict[str, str] = {}  # conversation id -> its current token

    def issue(self, conversation_id: str, auth: str) -> str:
        """A new token for a conversation a connection now carries (its old one, if any, stops working)."""
        self.forget(conversation_id)
        token = secrets.token_urlsafe(24)
        self._by_token[token] = _Held(conversation_id, auth)
        self._token_of[conversation_id] = token
        if self.log is not None:
            self.log.save_token(token, conversation_id, auth, None)
        return token

    def hold(self, conversation_id: str, now_s: float) -> list[str]:
        """Its connection dropped: the conversation may be taken back until now + window_s. -> conversations held
        longest that had to go to keep within max_held (the caller ends them)."""
        token = self._token_of.get(conversation_id)
        if token is not None:
            self._by_token[token].deadline_s = now_s + self.window_s
            if self.log is not None:
                self.log.hold_token(conversation_id, now_s + self.window_s)
        held = sorted((h.deadline_s, h.conversation_id) for h in self._by_token.values() if h.deadline_s is not None)
        gone = [conversation_id for _, conversation_id in held[: max(0, len(held) - self.max_held)]]
        for conversation_id in gone:
            self.forget(conversation_id)
        return gone

    def take(self, token: str, auth: str, now_s: float) -> str:
        """-> the conversation id the token resumes (its connection may still look up: the caller takes it over).
        ValueError saying why not (unknown, used, expired, another user's)."""
        held = self._by_token.get(token)
        if held is None:
            raise UnknownToken("unknown or already used resume token")
        if not hmac.compare_digest(held.auth, auth):
            raise ValueError("the resume token was issued to another client")
        if held.deadline_s is not None and now_s > held.deadline_s:
            raise ValueError(f"the resume token expired ({self.window_s:g} s after the connection dropped)")
        self.forget(held.conversation_id)
        return held.conversation_id

    def expired(self, now_s: float) -> list[str]:
        """Conversations held past their window: forgotten here; the caller ends them."""
        gone = [h.conversation_id for h in self._by_token.values() if h.deadline_s is not None and now_s > h.deadline_s]
        for conversation_id in gone:
            self.forget(conversation_id)
        return gone

    def forget(self, conversation_id: str) -> None:
        token = self._token_of.pop(conversation_id, None)
        if token is not None:
            self._by_token.pop(token, None)

    def holds(self, token: str) -> bool:
        """Whether `token` is one this process issued and has not spent (valid or not for its user, expired or not)."""
        return token in self._by_token

    def held(self) -> int:
        return sum(h.deadline_s is not None for h in self._by_token.values())


def owner_of(auth: str, user: str | None) -> str:
    """Whose facts a session's persona remembers (voice.user_memory): the client's user id under its auth token,
    hashed; "" when the client names no user (nobody to remember)."""
    return "" if user is None else hashlib.sha256(f"{auth}\n{user}".encode()).hexdigest()
