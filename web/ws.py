"""The /ws endpoint: admission (origin, token, capacity), limits (size, rate, idle), and the reader/writer pair
that connects one socket to one voice Session. Bad input becomes an `error` message, never a server failure.

Knows the wire (web.protocol) and the Session's public methods; nothing about models.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voice.audio import SAMPLE_RATE, pcm16_to_float, resample
from voice.outbox import OutAudio, Outbox
from voice.session import InputError, Session
from voice.trace import TurnTrace, now_ns
from web import protocol as P

if TYPE_CHECKING:
    from web.app import AppState

log = logging.getLogger(__name__)


class _Closed(Exception):
    """The connection is over (client left, fatal error, idle): unwinds the connection's task group."""


class RateLimiter:
    """Token bucket over messages: `rate` a second refilled by wall time, a burst of `burst_s` seconds' worth.

    Refill is measured between reads, and a server that stalled did not read: a well-behaved client's
    messages from the stall then arrive all at once. So the bucket may hold what the time since the last
    read earned (up to `stall_s` seconds' worth), not only the burst: a backlog after a stall passes, while a
    client that keeps sending faster than `rate` empties the bucket and is refused.
    """

    def __init__(self, rate: float, burst_s: float = 1.0, stall_s: float = 10.0) -> None:
        self.rate = rate
        self.burst = rate * burst_s
        self.max_credit = rate * max(burst_s, stall_s)
        self.tokens = self.burst
        self.last = time.monotonic()

    def allow(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        earned = max(0.0, now - self.last) * self.rate
        self.last = now
        # accrual stops at the burst, or at what this one gap earned when that is more (a stall's backlog);
        # credit already held above it is kept until spent, so the backlog drains over the following reads
        cap = max(self.burst, min(earned, self.max_credit), self.tokens)
        self.tokens = min(self.tokens + earned, cap)
        # A gap of exactly 1/rate can earn 0.99999999... in floating point (the clock's value is large, its
        # differences lose the low bits): a client sending at exactly the rate is not refused for that.
        if self.tokens >= 1.0 - 1e-6:
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...] | list[str]) -> bool:
    """No Origin (not a browser), a configured one, or the page's own server: an Origin whose host:port is the
    request's Host header (a page Parley served, whatever address or port it runs on)."""
    if origin is None or origin in allowed:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or host is None:
        return False
    default_port = {"http": 80, "https": 443}[parts.scheme]
    theirs, ours = _host_port(parts.netloc, default_port), _host_port(host, default_port)
    return theirs is not None and theirs == ours


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + netloc.strip())
        return (parts.hostname or "").lower(), parts.port or default_port
    except ValueError:  # a malformed port
        return None


def _token_ok(ws: WebSocket, expected: str) -> bool:
    given = ws.query_params.get("token")
    auth = ws.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def handle(ws: WebSocket, state: "AppState") -> None:
    """One connection from handshake to close."""
    server = state.cfg.server
    origin = ws.headers.get("origin")
    refusal: tuple[str, str, int] | None = None
    if not origin_allowed(origin, ws.headers.get("host"), server.allowed_origins):
        refusal = ("forbidden_origin", f"origin {origin!r} is not allowed", P.CLOSE_POLICY)
    elif server.token and not _token_ok(ws, server.token):
        refusal = ("unauthorized", "missing or wrong token (use ?token= or Authorization: Bearer)", P.CLOSE_POLICY)
    elif state.connections >= server.max_sessions:
        refusal = ("server_full", f"the server already has {server.max_sessions} sessions; try again later", P.CLOSE_TRY_AGAIN)
    if refusal is not None:
        # accepted first so a browser client can read why (a refused handshake shows no reason to scripts)
        code, message, close_code = refusal
        state.metrics.error(code)
        await ws.accept()
        await _safe_send(ws, P.error_message(code, message, fatal=True))
        await _safe_close(ws, close_code)
        return
    state.connections += 1  # counted before the first await, so concurrent handshakes cannot overshoot
    try:
        await ws.accept()
        await Connection(ws, state).run()
    finally:
        state.connections -= 1


async def _safe_send(ws: WebSocket, text: str) -> None:
    if ws.application_state == WebSocketState.CONNECTED:
        try:
            await ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):  # the client already left
            pass


async def _safe_close(ws: WebSocket, code: int) -> None:
    if ws.application_state == WebSocketState.CONNECTED:
        try:
            await ws.close(code)
        except (WebSocketDisconnect, RuntimeError, OSError):  # closed by the client in the meantime
            pass


class Connection:
    def __init__(self, ws: WebSocket, state: "AppState") -> None:
        self.ws = ws
        self.state = state
        self.limits = state.cfg.server
        self.outbox = Outbox()
        self.session: Session | None = None
        self.session_id = uuid.uuid4().hex[:12]
        self.input_rate = SAMPLE_RATE
        self.rate = RateLimiter(self.limits.max_messages_per_s)
        self.close_code = P.CLOSE_NORMAL
        self._last_rate_error = 0.0
        self._rate_dropped = 0
        self._writing = False

    async def run(self) -> None:
        self.state.metrics.session_opened()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._writer(), name=f"parley:{self.session_id}:writer")
                await self._reader()
                await self._flush()
                raise _Closed
        except* _Closed:
            pass
        finally:
            if self.session is not None:
                self.state.sessions.pop(self.session_id, None)
                await self.session.close()
            self.state.metrics.session_closed()
            await _safe_close(self.ws, self.close_code)

    # -- reading -------------------------------------------------------------------------------

    async def _reader(self) -> None:
        """Returns when the connection should end."""
        while True:
            try:
                async with asyncio.timeout(self.limits.idle_timeout_s):
                    msg = await self.ws.receive()
            except TimeoutError:
                self._error("idle_timeout", f"no message for {self.limits.idle_timeout_s:g} s", fatal=True)
                self.close_code = P.CLOSE_NORMAL
                return
            if msg["type"] == "websocket.disconnect":
                return
            arrival_ns = now_ns()
            data: bytes | None = msg.get("bytes")
            text: str | None = msg.get("text")
            size = len(data) if data is not None else len(text.encode()) if text is not None else 0
            if size > self.limits.max_message_bytes:
                self._error("too_large", f"message of {size} bytes; the limit is {self.limits.max_message_bytes}", fatal=True)
                self.close_code = P.CLOSE_TOO_BIG
                return
            if not self.rate.allow():
                self._rate_error()
                continue
            try:
                if data is not None:
                    self._on_audio(data, arrival_ns)
                elif text is not None:
                    self._on_text(text, arrival_ns)
            except P.ProtocolError as exc:
                self._error(exc.code, exc.message, fatal=exc.fatal)
                if exc.fatal:
                    self.close_code = exc.close_code
                    return
            except InputError as exc:
                self._error(exc.code, exc.message)

    def _on_audio(self, data: bytes, arrival_ns: int) -> None:
        if self.session is None:
            raise P.ProtocolError("not_started", "audio before session.start; send session.start first")
        P.check_audio(data, self.input_rate)
        samples = pcm16_to_float(data)  # float32 [N]
        if self.input_rate != SAMPLE_RATE:
            samples = resample(samples, self.input_rate, SAMPLE_RATE)
        self.session.push_audio(samples, arrival_ns)

    def _on_text(self, text: str, arrival_ns: int) -> None:
        msg = P.parse_text(text)
        if isinstance(msg, P.SessionStart):
            self._start(msg)
            return
        session = self.session
        if session is None:
            raise P.ProtocolError("not_started", f"{msg.type} before session.start; send session.start first")
        if isinstance(msg, P.InputText):
            session.text_input(msg.text)
        elif isinstance(msg, P.ResponseCancel):
            session.cancel_reply()
        elif isinstance(msg, P.PlaybackMark):
            session.playback_mark(msg.turn_id, msg.played_ms, arrival_ns)
        elif isinstance(msg, P.SessionUpdate):
            session.update(msg.persona, msg.voice)
            self.outbox.send("session.updated", persona=session.persona_name, voice=session.voice_name)

    def _start(self, msg: P.SessionStart) -> None:
        if self.session is not None:
            raise P.ProtocolError("already_started", "session.start was already accepted on this connection")
        st = self.state
        session = Session(
            self.session_id, st.stages, st.settings, st.personas, msg.persona or st.cfg.default_persona, msg.voice,
            outbox=self.outbox, on_trace=self._on_trace,
        )  # fmt: skip  (raises InputError for an unknown persona or voice: the client may try again)
        self.session = session
        self.input_rate = msg.sample_rate
        st.sessions[self.session_id] = session
        self.outbox.send("session.ready", **self._ready_fields())
        self._tg.create_task(session.run(), name=f"parley:{self.session_id}:session")

    def _ready_fields(self) -> dict[str, Any]:
        assert self.session is not None
        cfg = self.state.cfg
        return {
            "session_id": self.session_id,
            "protocol": P.PROTOCOL_VERSION,
            "input_sample_rate": self.input_rate,
            "output_sample_rate": self.state.settings.output_sample_rate,
            "persona": self.session.persona_name,
            "voice": self.session.voice_name,
            "personas": [
                {"name": p.name, "display_name": p.display_name, "voice": p.voice} for p in cfg.persona_defs.values()
            ],
            "voices": [{"name": n, "backend": v.backend, "description": v.description} for n, v in cfg.voices.items()],
        }

    def _on_trace(self, trace: TurnTrace) -> None:
        self.state.metrics.record_trace(trace.to_dict())

    def _error(self, code: str, message: str, *, fatal: bool = False) -> None:
        self.outbox.send("error", code=code, message=message, fatal=fatal)

    def _rate_error(self) -> None:
        self._rate_dropped += 1
        now = time.monotonic()
        if now - self._last_rate_error >= 1.0:  # one error a second, not one per dropped message
            self._last_rate_error = now
            rate = self.limits.max_messages_per_s
            self._error("rate_limited", f"sustained over {rate:g} messages a second (beyond a {rate:g}-message burst); "
                        f"{self._rate_dropped} dropped so far")  # fmt: skip

    # -- writing -------------------------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            item = await self.outbox.get()
            self._writing = True
            try:
                if isinstance(item, OutAudio):
                    await self.ws.send_bytes(P.pack_audio(item.turn_id, item.seq, item.pcm16))
                    if item.on_sent is not None:
                        item.on_sent()
                else:
                    body = item.body
                    if body["type"] == "error":
                        self.state.metrics.error(body["code"])
                    await self.ws.send_text(P.encode(body["type"], **{k: v for k, v in body.items() if k != "type"}))
            except (WebSocketDisconnect, RuntimeError, OSError):  # the client left; the reader sees it too
                raise _Closed from None
            finally:
                self._writing = False

    async def _flush(self, timeout_s: float = 2.0) -> None:
        """Let the writer deliver what is queued (a fatal error's message) before closing."""
        deadline = time.monotonic() + timeout_s
        while (self.outbox.pending() or self._writing) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
