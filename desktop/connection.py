"""One WebSocket session with a Parley server: handshake, session.start -> session.ready, send, receive.

Turns every way of failing to connect into ConnectError with a one-line reason, and says whether
trying again can help. Knows the wire (web/protocol.py), not audio or the terminal.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from web.protocol import CLOSE_POLICY, PROTOCOL_VERSION, SessionStart


class ConnectError(Exception):
    """Could not start a session. `retry` is False when trying again cannot help (a wrong token)."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class ConnectionLost(Exception):
    """An open session ended (server restart, network drop, fatal error)."""


@dataclass(frozen=True)
class ServerInfo:
    session_id: str
    input_sample_rate: int
    output_sample_rate: int
    persona: str
    voice: str
    personas: tuple[str, ...]
    voices: tuple[str, ...]

    @classmethod
    def from_ready(cls, msg: dict[str, Any]) -> ServerInfo:
        return cls(str(msg["session_id"]), int(msg["input_sample_rate"]), int(msg["output_sample_rate"]),
                   str(msg["persona"]), str(msg["voice"]), _names(msg["personas"]), _names(msg["voices"]))


def _names(items: list[Any]) -> tuple[str, ...]:
    """The server lists personas and voices as objects with a `name` (plain strings accepted too)."""
    return tuple(str(i["name"]) if isinstance(i, dict) else str(i) for i in items)


def ws_url(server: str) -> str:
    """`host:port`, `http(s)://host:port[/]` or `ws(s)://host:port/ws` -> the ws(s) URL of /ws."""
    if "://" not in server:
        server = "ws://" + server
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"--server: unsupported scheme {parts.scheme!r} (use ws://, wss://, http:// or host:port)")
    path = parts.path if parts.path not in ("", "/") else "/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def backoff_s(attempt: int) -> float:
    """Reconnect delay: 0.25 s doubling to at most 2 s, so a restarted server is found within 2 s."""
    return min(0.25 * 2 ** attempt, 2.0)


_AUTH_CODES = {"unauthorized", "forbidden", "bad_token", "auth_failed", "invalid_token"}


class Connection:
    """Open with `open()`; then `send_*` and `recv()` until ConnectionLost; `close()` any time."""

    def __init__(self, url: str, token: str | None, *, sample_rate: int = 16000,
                 open_timeout_s: float = 10.0, echo_cancelled: bool = False, user: str | None = None) -> None:
        self.echo_cancelled = echo_cancelled  # told the server: it then runs no echo canceller of its own
        self.user = user  # who the user is, for a persona with memory (docs/protocol.md, Memory)
        self.url = url
        self.token = token
        self.sample_rate = sample_rate
        self.open_timeout_s = open_timeout_s
        self.resume_token: str | None = None  # the last session.ready's: a reconnect carries the conversation on
        self.resumed = False  # the last open() carried the conversation of a dropped connection on
        self._ws: Any = None

    async def open(self, persona: str | None, voice: str | None) -> ServerInfo:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            ws = await connect(self.url, additional_headers=headers, open_timeout=self.open_timeout_s,
                               compression=None, proxy=None, max_size=4 << 20, ping_interval=None)
        except InvalidStatus as exc:
            code = exc.response.status_code
            if code in (401, 403):
                raise ConnectError(f"the server at {self.url} rejected the token (HTTP {code}); check --token",
                                   retry=False) from None
            raise ConnectError(f"the server at {self.url} refused the connection (HTTP {code})",
                               retry=code >= 500) from None
        except (OSError, asyncio.TimeoutError, InvalidHandshake) as exc:
            raise ConnectError(f"cannot reach a Parley server at {self.url} ({exc.__class__.__name__}: {exc}); "
                               "is `parley serve` running? Use --server HOST:PORT", retry=True) from None
        self._ws = ws
        start = SessionStart(type="session.start", protocol=PROTOCOL_VERSION, sample_rate=self.sample_rate,
                             persona=persona, voice=voice, echo_cancelled=self.echo_cancelled, resume=self.resume_token,
                             user=self.user)
        try:
            # A refused session (wrong token) may already be closing; its reason is still readable.
            with contextlib.suppress(ConnectionClosed):
                await ws.send(start.model_dump_json(exclude_none=True, exclude=None if self.echo_cancelled else {"echo_cancelled"}))
            while True:
                raw = await asyncio.wait_for(ws.recv(), self.open_timeout_s)
                if isinstance(raw, bytes):
                    continue
                msg = json.loads(raw)
                if msg.get("type") == "session.ready":
                    self.resume_token, self.resumed = msg.get("resume_token"), bool(msg.get("resumed"))
                    return ServerInfo.from_ready(msg)
                if msg.get("type") == "error" and msg.get("code") == "resume_failed":
                    self.resume_token = None  # too late or unknown: the server starts a new conversation
                    continue
                if msg.get("type") == "error":
                    await self.close()
                    auth = msg.get("code") in _AUTH_CODES
                    hint = "; check --token" if auth else ""
                    raise ConnectError(f"the server refused the session: {msg.get('message')}{hint}",
                                       retry=not auth and not msg.get("fatal"))
        except ConnectionClosed as exc:
            self._ws = None
            reason = exc.rcvd.reason if exc.rcvd else ""
            policy = exc.rcvd is not None and exc.rcvd.code == CLOSE_POLICY  # token or origin: retrying cannot help
            raise ConnectError(f"the server closed the session before it was ready ({reason or 'no reason'})"
                               + ("; check --token" if policy else ""), retry=not policy) from None
        except asyncio.TimeoutError:
            await self.close()
            raise ConnectError(f"the server at {self.url} did not answer session.start", retry=True) from None

    async def send_json(self, msg: BaseModel | dict[str, Any]) -> None:
        text = msg.model_dump_json(exclude_none=True) if isinstance(msg, BaseModel) else json.dumps(msg)
        await self._send(text)

    async def send_audio(self, pcm16: bytes) -> None:
        await self._send(pcm16)

    async def _send(self, data: str | bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise ConnectionLost("not connected")
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionLost(str(exc)) from None

    async def recv(self) -> str | bytes:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise ConnectionLost("not connected")
        try:
            return await self._ws.recv()
        except ConnectionClosed as exc:
            raise ConnectionLost(str(exc)) from None

    async def close(self) -> None:
        """Closed on purpose (1000): the server ends the conversation, so there is nothing to resume."""
        self.resume_token = None
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
