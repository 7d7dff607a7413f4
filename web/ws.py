"""The /ws endpoint: admission (origin, token, capacity), limits (size, rate, audio against real time, the
handshake deadline, idle), and the reader/writer pair that connects one socket to one voice Session. Bad input
becomes an `error` message, never a server failure, and no client holds a slot it does not use.

Knows the wire (web.protocol) and the Session's public methods; nothing about models.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voice.audio import SAMPLE_RATE, pcm16_to_float
from voice.outbox import OutAudio, Outbox
from voice.session import InputError, Session
from voice.trace import TurnTrace, now_ns
from web import protocol as P
from web.limits import RateLimiter, given_token, origin_allowed, token_ok
from web.resume import owner_of
from web.state import AppState


log = logging.getLogger(__name__)


HAND_OVER_S = 8.0  # the longest a resuming connection waits for the old one to let its conversation go


class _Closed(Exception):
    """The connection is over (client left, fatal error, idle): unwinds the connection's task group."""


async def handle(ws: WebSocket, state: AppState) -> None:
    """One connection from handshake to close."""
    server = state.cfg.server
    origin = ws.headers.get("origin")
    refusal: tuple[str, str, int] | None = None
    retry: dict[str, int] = {}
    if not origin_allowed(origin, ws.headers.get("host"), server.allowed_origins):
        refusal = ("forbidden_origin", f"origin {P.clip(origin)} is not allowed", P.CLOSE_POLICY)
    elif server.token and not token_ok(given_token(ws.query_params, ws.headers, ws.cookies), server.token):
        refusal = ("unauthorized", "missing or wrong token (use ?token= or Authorization: Bearer)", P.CLOSE_POLICY)
    elif (full := state.refusal_detail()) is not None:
        refusal = ("server_full", f"{full.reason}; try again later", P.CLOSE_TRY_AGAIN)
        retry = {"retry_after_ms": full.retry_after_ms}
    if refusal is not None:
        # accepted first so a browser client can read why (a refused handshake shows no reason to scripts)
        code, message, close_code = refusal
        state.metrics.error(code)
        await ws.accept()
        await _safe_send(ws, P.error_message(code, message, fatal=True, **retry))
        await _safe_close(ws, close_code)
        return
    connection = Connection(ws, state)
    if len(state.pending) >= server.max_pending:  # the socket that has waited longest without starting goes
        next(iter(state.pending)).evict()
    state.pending[connection] = None  # counted before the first await, so concurrent handshakes cannot overshoot
    state.live.add(connection)
    state.connections += 1
    try:
        await ws.accept()
        await connection.run()
    finally:
        state.pending.pop(connection, None)
        state.live.discard(connection)
        state.connections -= 1


async def drain(state: AppState, grace_s: float) -> None:
    """SIGTERM: every connection's running reply may finish (up to `grace_s`); then each client is told and closed."""
    await asyncio.gather(*(c.shut_down(grace_s) for c in list(state.live)))


async def receive_until(ws: WebSocket, stop: asyncio.Event, timeout_s: float) -> dict[str, Any] | None:
    """The socket's next message, or None when `stop` is set or `timeout_s` passes first."""
    receive = asyncio.ensure_future(ws.receive())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({receive, stopped}, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if receive in done:
        return receive.result()
    receive.cancel()
    return None


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
    transport = "ws"  # what the session's span calls it (web.otel)

    def __init__(self, ws: WebSocket, state: AppState, auth: str | None = None) -> None:
        """`auth`: the bearer token the client connected with (read off `ws` when not given)."""
        self.ws = ws
        self.state = state
        self.limits = state.cfg.server
        self.outbox = Outbox()
        self.session: Session | None = None
        self.session_id = uuid.uuid4().hex[:12]
        self.input_rate = SAMPLE_RATE
        self.rate = RateLimiter(self.limits.max_messages_per_s)
        # audio seconds a second: what a microphone sends, with room for a burst and a stalled server's backlog
        self.audio_rate = RateLimiter(1.0, burst_s=self.limits.audio_burst_s)
        self.close_code = P.CLOSE_NORMAL
        self._dropped: dict[str, int] = {}  # messages dropped by a limit, per error code, since its last error
        self._last_error_s: dict[str, float] = {}
        self._client_playback: dict[int, dict[str, float]] = {}  # turn -> the client's own start_ms / underruns
        self._writing = False
        self._opened_at = self._active_at = time.monotonic()
        self._stop = asyncio.Event()
        self._stop_reason: tuple[str, str, int] | None = None  # (error code, message, close code) when told to stop
        self._finished = asyncio.Event()  # run() is over: the client was told and the socket closed
        if auth is None:
            auth = given_token(ws.query_params, ws.headers, ws.cookies) or ""
        self._auth = auth  # what a resume token is bound to
        self._client_close: int | None = None  # the close code the client sent (1000: it is done; else it dropped)
        self.resumed = False  # this connection carries on a dropped one's conversation
        self._handed_over = False  # another connection resumed this one's conversation

    def evict(self) -> None:
        """A newer connection needs the room of this one, which has not started a session."""
        self.state.pending.pop(self, None)
        self._stop_reason = ("handshake_timeout", "no session.start before a newer connection needed the room", P.CLOSE_NORMAL)
        self._stop.set()

    async def shut_down(self, grace_s: float) -> None:
        """The server is stopping: the reply being spoken may finish (up to `grace_s`), then the client is told."""
        if self.session is not None:
            await self.session.reply_finished(grace_s)
        self._stop_reason = ("server_shutdown", "the server is shutting down; connect again shortly", P.CLOSE_GOING_AWAY)
        self._stop.set()
        # closed by us (1001, after the message), not by the server's own shutdown that follows the drain (1012)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), timeout=5.0)

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
                # dropped, or the server is restarting: the client may carry the conversation on
                dropped = self._client_close not in (None, P.CLOSE_NORMAL) or (self._stop_reason or ("",))[0] == "server_shutdown"
                await self.state.close_session(self.session, resumable=dropped, handed_over=self._handed_over)
            self.state.metrics.session_closed()
            await _safe_close(self.ws, self.close_code)
            self._finished.set()

    # -- reading -------------------------------------------------------------------------------

    async def _reader(self) -> None:
        """Returns when the connection should end."""
        while True:
            msg = await self._receive()
            if msg is not None and msg["type"] == "websocket.disconnect":
                self._client_close = int(msg.get("code") or 1005)
                return
            if msg is None:
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
                self._limited("rate_limited", f"sustained over {self.limits.max_messages_per_s:g} messages a second "
                                              f"(beyond a {self.limits.max_messages_per_s:g}-message burst)")  # fmt: skip
                continue
            try:
                if data is not None:
                    self._on_audio(data, arrival_ns)
                elif text is not None:
                    await self._on_text(text, arrival_ns)
                if self.session is not None:  # only a started session's accepted messages keep it alive
                    self._active_at = time.monotonic()
            except P.ProtocolError as exc:
                self._error(exc.code, exc.message, fatal=exc.fatal, **exc.extra)
                if exc.fatal:
                    self.close_code = exc.close_code
                    return
            except InputError as exc:
                if exc.code == "overloaded":
                    self._limited(exc.code, exc.message)
                else:
                    self._error(exc.code, exc.message)
            if self.outbox.overflowed:  # it stopped reading long ago: what it is sent piles up
                self._error("too_slow", "the client does not read what it is sent", fatal=True)
                self.close_code = P.CLOSE_POLICY
                return

    async def _receive(self) -> dict[str, Any] | None:
        """The next message; None (the client told why) when the handshake deadline or the idle timeout passes,
        or an unstarted connection is evicted for a newer one."""
        now = time.monotonic()
        if self.session is None:
            left_s = self.limits.handshake_timeout_s - (now - self._opened_at)
            code, why = "handshake_timeout", f"no session.start within {self.limits.handshake_timeout_s:g} s"
        else:
            left_s = self.limits.idle_timeout_s - (now - self._active_at)
            code, why = "idle_timeout", f"no message for {self.limits.idle_timeout_s:g} s"
        msg = await receive_until(self.ws, self._stop, left_s)
        if msg is not None:
            return msg
        close_code = P.CLOSE_NORMAL
        if self._stop_reason is not None:
            code, why, close_code = self._stop_reason
        self._error(code, why, fatal=True)
        self.close_code = close_code
        return None

    def _on_audio(self, data: bytes, arrival_ns: int) -> None:
        if self.session is None:
            raise P.ProtocolError("not_started", "audio before session.start; send session.start first")
        P.check_audio(data, self.input_rate)
        if not self.audio_rate.allow(cost=len(data) / 2 / self.input_rate):
            raise InputError("overloaded", "audio is arriving faster than real time; the excess is dropped")
        self.session.push_audio(pcm16_to_float(data), arrival_ns, self.input_rate)  # resampled by the front end

    async def _on_text(self, text: str, arrival_ns: int) -> None:
        msg = P.parse_text(text)
        if isinstance(msg, P.SessionStart):
            await self._start(msg)
            return
        session = self.session
        if session is None:
            raise P.ProtocolError("not_started", f"{msg.type} before session.start; send session.start first")
        if isinstance(msg, P.InputText):
            session.text_input(msg.text)
        elif isinstance(msg, P.ResponseCancel):
            session.cancel_reply()
        elif isinstance(msg, P.PlaybackMark):
            self._note_client_playback(msg)  # before the mark: the first mark may release the turn's held trace
            session.playback_mark(msg.turn_id, msg.played_ms, arrival_ns, paused=msg.paused)
        elif isinstance(msg, P.SessionUpdate):
            session.update(msg.persona, msg.voice)
            self.outbox.send("session.updated", persona=session.persona_name, voice=session.voice_name)

    async def _start(self, msg: P.SessionStart) -> None:
        if self.session is not None:
            raise P.ProtocolError("already_started", "session.start was already accepted on this connection")
        st = self.state
        # admission prices new conversations: one held here for this reconnect was admitted (its slot kept); one read
        # back after a restart holds nothing here yet, so it is priced like a new one
        held_here = msg.resume is not None and st.resume.holds(msg.resume)
        if not held_here:
            self._admit()
        # a client with its own echo canceller (and every WebRTC peer: a browser's media stack has one, and the marks
        # there are the server's own) needs none of the server's
        own_aec = msg.echo_cancelled or self.transport == "webrtc"
        settings = replace(st.settings, server_aec=False) if own_aec else st.settings
        self.resumed = False
        if msg.resume is not None:
            try:  # the dropped connection's conversation, carried on: no second greeting
                self.session_id = await self._take_over(await st.take_resume(msg.resume, self._auth))
                settings, self.resumed = replace(settings, greet=False), True
            except ValueError as exc:
                self._error("resume_failed", f"{exc}; a new conversation starts")
        if held_here and not self.resumed:
            self._admit()
        session = st.open_session(self.session_id, settings, msg.persona or st.cfg.default_persona, msg.voice,
                                  outbox=self.outbox, on_trace=self._on_trace, user=owner_of(self._auth, msg.user))  # fmt: skip
        # (raises InputError for an unknown persona or voice: the client may try again)
        self.session = session
        self.input_rate = msg.sample_rate
        st.pending.pop(self, None)
        st.telemetry.session_opened(self.session_id, transport=self.transport, persona=session.persona_name, voice=session.voice_name)
        self.outbox.send("session.ready", **self._ready_fields())
        self._tg.create_task(session.run(), name=f"parley:{self.session_id}:session")

    def _admit(self) -> None:
        """server_full (fatal, 1013) when the server takes no new conversation now."""
        if (full := self.state.refusal_detail()) is not None:
            raise P.ProtocolError("server_full", f"{full.reason}; try again later", fatal=True, close_code=P.CLOSE_TRY_AGAIN,
                                  extra={"retry_after_ms": full.retry_after_ms})  # fmt: skip

    async def _take_over(self, conversation_id: str) -> str:
        """The conversation a token resumes, free for this connection: the one still carrying it (the server may not
        have seen the old socket die yet: a phone that changed networks) is stopped and waited for."""
        st = self.state
        old = next((c for c in list(st.live) if c is not self and c.session is not None and c.session_id == conversation_id), None)
        if old is not None:
            old.hand_over()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(old._finished.wait(), timeout=HAND_OVER_S)
        conversation = st.conversations.get(conversation_id)
        if conversation is None or conversation.attached:
            raise ValueError("the conversation could not be taken over")
        return conversation_id

    def hand_over(self) -> None:
        """Another connection resumed this one's conversation: stop, keeping it for that one."""
        self._handed_over = True
        self._stop_reason = ("resumed_elsewhere", "this conversation was resumed by another connection", P.CLOSE_NORMAL)
        self._stop.set()

    def _ready_fields(self) -> dict[str, Any]:
        assert self.session is not None
        cfg = self.state.cfg
        return {
            "session_id": self.session_id,
            "resume_token": self.state.resume.issue(self.session_id, self._auth) if self.state.resume.window_s > 0 else None,
            "resumed": self.resumed,
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

    def _note_client_playback(self, msg: P.PlaybackMark) -> None:
        """Keep what the client measured of its own playback for the turn's trace (the log, /api/traces)."""
        if msg.start_ms is None and msg.underruns is None:
            return
        seen = self._client_playback.setdefault(msg.turn_id, {})
        if msg.start_ms is not None:
            seen.setdefault("client_playback_ms", round(msg.start_ms, 1))
        if msg.underruns is not None:
            seen["client_underruns"] = msg.underruns
        while len(self._client_playback) > 16:  # turns without a trace (greetings) must not pile up
            self._client_playback.pop(next(iter(self._client_playback)))

    def _on_trace(self, trace: TurnTrace) -> None:
        trace.info.update(self._client_playback.pop(trace.turn_id, {}))
        self.state.record_turn(trace)

    def _error(self, code: str, message: str, *, fatal: bool = False, **extra: object) -> None:
        self.outbox.send("error", code=code, message=message, fatal=fatal, **extra)

    def _limited(self, code: str, message: str) -> None:
        """A message dropped by a limit: one error a second per limit, counting the drops, not one per message."""
        self._dropped[code] = self._dropped.get(code, 0) + 1
        now = time.monotonic()
        if now - self._last_error_s.get(code, 0.0) >= 1.0:
            self._last_error_s[code] = now
            self._error(code, f"{message}; {self._dropped[code]} dropped so far")

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
