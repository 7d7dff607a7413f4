"""/twilio/stream: a phone call through Twilio Media Streams, as one voice Session (the same core as /ws and
/v1/realtime; no second pipeline). μ-law 8 kHz in (resampled to 16 kHz, voice.codec), replies spoken at 8 kHz
and sent μ-law as `media`, each followed by a `mark` whose echo is the caller's playback mark; a barge-in sends
`clear`. The call's token comes as the stream's `token` parameter (TwiML, web.twilio_voice) or as on /ws.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voice import codec
from voice.outbox import OutAudio, Outbox
from voice.session import InputError, Session
from voice.trace import now_ns
from web import twilio_wire as W
from web.limits import RateLimiter, given_token, origin_allowed, token_ok
from web.state import AppState
from web.twilio_voice import signature_ok
from web.ws import receive_until

log = logging.getLogger(__name__)


async def handle_twilio(ws: WebSocket, state: AppState) -> None:
    server = state.cfg.server
    if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), server.allowed_origins):
        await ws.close(1008)  # Twilio sends no Origin; a page from elsewhere may not call out through this server
        return
    signature = ws.headers.get("x-twilio-signature")
    try:
        # signed over the stream's URL as Twilio opened it: wss:// behind a TLS proxy, whatever this hop was
        urls = {str(ws.url), str(ws.url.replace(scheme="wss"))}
        signed = signature is None or any(signature_ok(state.cfg, url, {}, signature) for url in urls)
    except RuntimeError as exc:  # configured to check, without the token to check with
        log.error("twilio: %s", exc)
        signed = False
    if not signed:  # a stream Twilio signed is checked; the call's token (at start) is required either way
        state.metrics.error("forbidden")
        await ws.close(1008)
        return
    call = TwilioCall(ws, state)
    if len(state.pending) >= server.max_pending:
        next(iter(state.pending)).evict()
    state.pending[call] = None
    state.live.add(call)
    state.connections += 1
    try:
        await ws.accept()
        await call.run()
    finally:
        state.pending.pop(call, None)
        state.live.discard(call)
        state.connections -= 1


class _Ended(Exception):
    """The call is over (stop, hang-up, a fatal error, idle)."""


class TwilioCall:
    def __init__(self, ws: WebSocket, state: AppState) -> None:
        self.ws, self.state = ws, state
        self.limits = state.cfg.server
        self.session_id = uuid.uuid4().hex[:12]
        self.outbox = Outbox()
        self.session: Session | None = None
        self.stream_sid = ""
        self.rate = RateLimiter(self.limits.max_messages_per_s)
        self.audio_rate = RateLimiter(1.0, burst_s=self.limits.audio_burst_s)
        self.sending: tuple[int, float] = (0, 0.0)  # the turn whose audio is being sent, and how much of it so far
        self.cleared: set[int] = set()  # turns cleared: Twilio echoes their pending marks at once, unplayed
        self._stop = asyncio.Event()
        self._finished = asyncio.Event()
        self._opened_at = time.monotonic()
        self._why_stopped = "the server is shutting down"

    def evict(self) -> None:
        """A newer connection needs the room of this one, which has not started."""
        self.state.pending.pop(self, None)
        self._why_stopped = "no start before a newer connection needed the room"
        self._stop.set()

    async def shut_down(self, grace_s: float) -> None:
        """SIGTERM: the reply being spoken may finish (up to `grace_s`), then the call's stream is closed."""
        if self.session is not None:
            await self.session.reply_finished(grace_s)
        self._stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), timeout=5.0)

    async def run(self) -> None:
        self.state.metrics.session_opened()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._writer(), name=f"parley:{self.session_id}:twilio-writer")
                await self._reader()
                await self._flush()
                raise _Ended  # unwinds the group: the writer and the session's task are cancelled
        except* (_Ended, WebSocketDisconnect, OSError, RuntimeError):
            pass
        finally:
            if self.session is not None:
                await self.state.close_session(self.session)
            self.state.metrics.session_closed()
            if self.ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                    await self.ws.close(1000)
            self._finished.set()

    # -- reading -------------------------------------------------------------------------------

    async def _reader(self) -> None:
        active = time.monotonic()
        while True:
            if self.session is None:
                left_s = self.limits.handshake_timeout_s - (time.monotonic() - self._opened_at)
            else:
                left_s = self.limits.idle_timeout_s - (time.monotonic() - active)
            msg = await receive_until(self.ws, self._stop, left_s)
            if msg is None:
                log.info("twilio %s: closed (%s)", self.session_id, self._why_stopped if self._stop.is_set() else "no message in time")
                return
            if msg["type"] == "websocket.disconnect":
                return
            text = msg.get("text")
            if text is None or len(text) > self.limits.max_message_bytes:
                self._refuse("a Twilio message is JSON text within server.max_message_bytes")
                continue
            if not self.rate.allow():
                continue  # over the message rate: dropped (Twilio sends 50 a second)
            try:
                if self._on_event(W.parse(text), now_ns()):
                    return
                active = time.monotonic()
            except W.WireError as exc:
                self._refuse(str(exc))
            except InputError as exc:
                if exc.code != "overloaded":
                    self._refuse(f"{exc.code}: {exc.message}")
            except _Ended:
                return

    def _on_event(self, event: W.Event, arrival_ns: int) -> bool:
        """-> True when the call is over."""
        if isinstance(event, W.Start):
            self._start(event)
        elif isinstance(event, W.Media):
            self._media(event, arrival_ns)
        elif isinstance(event, W.Mark):
            self._mark(event.mark.name, arrival_ns)
        elif event.event == "stop":
            return True
        return False  # connected, dtmf

    def _start(self, event: W.Start) -> None:
        if self.session is not None:
            raise W.WireError("start: the stream already started")
        server = self.state.cfg.server
        token = given_token(self.ws.query_params, self.ws.headers, self.ws.cookies) or event.start.custom_parameters.get("token")
        if server.token and not token_ok(token, server.token):
            self.state.metrics.error("unauthorized")
            raise _Ended  # a stream without the call's token is closed at once
        if (full := self.state.refusal()) is not None:
            self.state.metrics.error("server_full")
            log.warning("twilio %s: refused (%s)", self.session_id, full)
            raise _Ended
        st = self.state
        # spoken straight at the line's rate; the phone network cancels its own line echo, and AEC3 against marks that
        # say only when Twilio's buffer played would cost the caller's first words (docs/turn-taking.md)
        settings = replace(st.settings, output_sample_rate=codec.G711_RATE, server_aec=False)
        params = event.start.custom_parameters
        persona = params.get("persona") or st.cfg.twilio.persona or st.cfg.default_persona
        self.session = st.open_session(self.session_id, settings, persona, params.get("voice"),
                                       outbox=self.outbox, on_trace=st.record_turn)  # fmt: skip
        self.stream_sid = event.start.stream_sid or event.stream_sid
        st.pending.pop(self, None)
        st.telemetry.session_opened(self.session_id, transport="twilio", persona=self.session.persona_name,
                                    voice=self.session.voice_name)  # fmt: skip
        log.info("twilio %s: call %s, stream %s", self.session_id, event.start.call_sid, self.stream_sid)
        self._tg.create_task(self.session.run(), name=f"parley:{self.session_id}:session")

    def _media(self, event: W.Media, arrival_ns: int) -> None:
        if self.session is None:
            raise W.WireError("media before start")
        if event.media.track not in ("inbound", "inbound_track"):
            return  # the caller is the inbound track; an outbound one would be our own voice
        data = W.payload(event)
        if not self.audio_rate.allow(cost=len(data) / codec.G711_RATE):
            raise InputError("overloaded", "audio faster than real time")
        self.session.push_audio(codec.decode("pcmu", data), arrival_ns, codec.G711_RATE)

    def _mark(self, name: str, arrival_ns: int) -> None:
        mark = W.parse_mark(name)
        if mark is None or self.session is None:
            return  # not one of ours
        turn_id, played_ms = mark
        if turn_id in self.cleared:
            return  # echoed because the clear emptied Twilio's buffer: not played
        self.session.playback_mark(turn_id, played_ms, arrival_ns)

    def _refuse(self, why: str) -> None:
        """A bad message: logged and dropped; the call goes on (Twilio has no channel for our errors)."""
        self.state.metrics.error("invalid_message")
        log.warning("twilio %s: %s", self.session_id, why[:200])

    # -- writing -------------------------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, OutAudio):
                ulaw = codec.ulaw_encode(item.pcm16)
                turn, sent_ms = self.sending
                played_ms = (sent_ms if turn == item.turn_id else 0.0) + 1000.0 * len(ulaw) / codec.G711_RATE
                self.sending = (item.turn_id, played_ms)
                await self.ws.send_text(W.media_out(self.stream_sid, ulaw))
                await self.ws.send_text(W.mark_out(self.stream_sid, W.mark_name(item.turn_id, played_ms)))
                if item.on_sent is not None:
                    item.on_sent()
                continue
            body = item.body
            if body["type"] == "response.audio.clear":
                self.cleared.add(body["turn_id"])
                await self.ws.send_text(W.clear_out(self.stream_sid))
            elif body["type"] == "error":
                self.state.metrics.error(body["code"])
                log.warning("twilio %s: %s: %s", self.session_id, body["code"], body["message"])

    async def _flush(self, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.outbox.pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

