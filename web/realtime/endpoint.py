"""/v1/realtime: one Realtime API connection driving one voice Session (the same core as /ws, docs/realtime.md).

Admission as on /ws (origin, token, capacity), the token also as a browser's `openai-insecure-api-key.` subprotocol;
then `session.created` at once. Client events become Session calls; what the Session says comes back through
web.realtime.translate. A bad event is an `error` event naming it; the session goes on.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from voice.audio import SAMPLE_RATE
from voice.outbox import OutAudio, Outbox
from voice.session import InputError, Session
from voice.trace import now_ns
from web import protocol as P
from web.limits import RateLimiter, given_token, origin_allowed, token_ok
from web.realtime.config import RATE, RealtimeConfig, SessionIn
from web.realtime.tools import check_output
from web.realtime.translate import Translator, error_event, new_id
from web.realtime.wire_audio import WireAudio, bytes_per_second
from web.state import AppState
from web.ws import receive_until

log = logging.getLogger(__name__)
KEY_PROTOCOL = "openai-insecure-api-key."
_NATIVE = "realtime.event"  # an outbox message that already is a Realtime event


class EventError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


async def handle_realtime(ws: WebSocket, state: AppState) -> None:
    server = state.cfg.server
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = given_token(ws.query_params, ws.headers, ws.cookies) or next(
        (p[len(KEY_PROTOCOL):] for p in offered if p.startswith(KEY_PROTOCOL)), None)  # fmt: skip
    subprotocol = "realtime" if "realtime" in offered else None
    refusal: tuple[str, str, int] | None = None
    if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), server.allowed_origins):
        refusal = ("forbidden_origin", "this origin is not allowed", P.CLOSE_POLICY)
    elif server.token and not token_ok(token, server.token):
        refusal = ("invalid_api_key", "missing or wrong key (Authorization: Bearer, or the key subprotocol)", P.CLOSE_POLICY)
    elif (full := state.refusal()) is not None:
        refusal = ("server_full", f"{full}; try again later", P.CLOSE_TRY_AGAIN)
    await ws.accept(subprotocol=subprotocol)
    if refusal is not None:
        code, message, close_code = refusal
        state.metrics.error(code)
        await ws.send_text(json.dumps({"event_id": new_id("event"), **error_event("invalid_request_error", code, message)}))
        await ws.close(close_code)
        return
    conn = RealtimeConnection(ws, state, ws.query_params.get("model") or "parley")
    state.connections += 1
    state.live.add(conn)  # SIGTERM drains it too (web.ws.drain)
    try:
        await conn.run()
    finally:
        state.live.discard(conn)
        state.connections -= 1


class RealtimeConnection:
    def __init__(self, ws: WebSocket, state: AppState, model: str) -> None:
        from web.openai_api.app import voice_aliases

        self.ws, self.state, self.model = ws, state, P.clip(model, 100)
        self.model_name = P.shorten(model, 100)  # as asked, unquoted (the session's span)
        self.limits = state.cfg.server
        self.session_id = uuid.uuid4().hex[:12]
        self.outbox = Outbox()
        self.aliases = voice_aliases(state.cfg)
        self.config = RealtimeConfig(voice="alloy", instructions="")
        self.base = state.settings
        settings = replace(state.settings, output_sample_rate=RATE, greet=False)  # OpenAI's rate; no greeting
        self.session = state.open_session(self.session_id, settings, state.cfg.default_persona, None,
                                          outbox=self.outbox, on_trace=state.record_turn)  # fmt: skip
        self.translator = Translator()
        self.wire_audio = WireAudio()  # audio/pcm, or G.711 (audio/pcmu, audio/pcma), each way
        self.rate = RateLimiter(self.limits.max_messages_per_s)
        self.audio_rate = RateLimiter(1.0, burst_s=self.limits.audio_burst_s)
        self.buffer: list[np.ndarray] = []  # manual commits: the audio appended since the last commit (16 kHz)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_limited: dict[str, float] = {}  # a limit's error goes out at most once a second
        self._stop = asyncio.Event()  # the server is shutting down
        self._finished = asyncio.Event()

    async def run(self) -> None:
        st = self.state
        st.metrics.session_opened()
        st.telemetry.session_opened(self.session_id, transport="realtime", model=self.model_name)
        self._native({"type": "session.created", "session": self._wire()})
        try:
            async with asyncio.TaskGroup() as tg:
                writer = tg.create_task(self._writer())
                session = tg.create_task(self.session.run())
                await self._reader()
                writer.cancel()
                session.cancel()
        except* (WebSocketDisconnect, OSError, RuntimeError):
            pass
        finally:
            for task in self._tasks:
                task.cancel()
            await st.close_session(self.session)
            st.metrics.session_closed()
            try:
                await self.ws.close(P.CLOSE_GOING_AWAY if self._stop.is_set() else P.CLOSE_NORMAL)
            except (WebSocketDisconnect, RuntimeError, OSError):  # the client closed first
                pass
            self._finished.set()

    async def shut_down(self, grace_s: float) -> None:
        """SIGTERM: the answer being spoken may finish (up to `grace_s`), then the client is told and closed."""
        await self.session.reply_finished(grace_s)
        self._error("server_shutdown", "the server is shutting down; connect again shortly", type_="server_error")
        self._stop.set()
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=5.0)
        except TimeoutError:
            pass

    # -- reading -----------------------------------------------------------------------------------------

    async def _reader(self) -> None:
        active = time.monotonic()
        while True:
            left = self.limits.idle_timeout_s - (time.monotonic() - active)
            msg = await receive_until(self.ws, self._stop, left)
            if msg is None:
                if not self._stop.is_set():
                    self._error("idle_timeout", f"no event for {self.limits.idle_timeout_s:g} s")
                await self._flush()
                return
            if msg["type"] == "websocket.disconnect":
                return
            text = msg.get("text")
            if text is None:
                self._error("invalid_event", "binary messages are not events; send JSON text")
                continue
            if len(text) > self.limits.max_message_bytes:
                self._error("too_large", f"event of {len(text)} bytes; the limit is {self.limits.max_message_bytes}")
                continue
            if not self.rate.allow():
                self._limited("rate_limited", f"over {self.limits.max_messages_per_s:g} events a second; dropped")
                continue
            event_id = None
            try:
                event = json.loads(text)
                if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                    raise EventError("invalid_event", "an event is a JSON object with a string `type`")
                event_id = str(event["event_id"])[:100] if event.get("event_id") is not None else None
                self._on_event(event, now_ns())
                active = time.monotonic()
            except (json.JSONDecodeError, ValueError, RecursionError) as exc:
                if isinstance(exc, ValidationError):
                    e = exc.errors()[0]
                    param = P.shorten(".".join(str(p) for p in e["loc"]))  # field names are the client's text too
                    self._error("invalid_value", f"{param}: {e['msg']}", param=param, event_id=event_id)
                else:
                    self._error("invalid_json", f"not JSON: {type(exc).__name__}", event_id=event_id)
            except EventError as exc:
                if exc.code == "rate_limited":
                    self._limited(exc.code, exc.message)
                else:
                    self._error(exc.code, exc.message, param=exc.param, event_id=event_id)
            except InputError as exc:
                if exc.code == "overloaded":
                    self._limited(exc.code, exc.message)
                else:
                    self._error(exc.code, exc.message, event_id=event_id)
            if self.outbox.overflowed:  # it stopped reading long ago: what it is sent piles up
                await self.ws.close(P.CLOSE_POLICY)
                return

    def _on_event(self, event: dict[str, Any], arrival_ns: int) -> None:
        kind = event["type"]
        handler = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item_create,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
            "conversation.item.truncate": self._truncate,
        }.get(kind)
        if handler is None:
            raise EventError("unknown_event", f"unknown event type {P.clip(kind)}", param="type")
        handler(event, arrival_ns)

    def _session_update(self, event: dict[str, Any], arrival_ns: int) -> None:
        patch = SessionIn.model_validate(event.get("session") or {})
        try:
            config = self.config.updated(patch)
        except ValueError as exc:
            param = "session.tool_choice" if str(exc).startswith("tool_choice") else "session.tools"
            raise EventError("invalid_value", str(exc), param=param) from None
        voice = self.aliases.get(config.voice, config.voice)
        if voice not in self.state.stages.voices:
            known = ", ".join(sorted({*self.aliases, *self.state.stages.voices}))
            raise EventError("invalid_value", f"unknown voice {P.clip(config.voice)} (known: {known})", "session.audio.output.voice")
        s = self.session
        s.update(voice=voice)
        s.instructions = config.instructions or None
        s.client_tools = config.tools  # calls of these come to the client as function_call items
        s.client_tool_choice = config.tool_choice if config.tools else None
        s.speak = config.modality == "audio"
        self.translator.modality = config.modality
        td = config.turn_detection
        s.auto_reply = td is None or td.create_response
        s.retune(config.turn_policy(self.base.turns), config.vad_threshold(self.base.vad_threshold))
        self.config = config
        self._native({"type": "session.updated", "session": self._wire()})

    def _append(self, event: dict[str, Any], arrival_ns: int) -> None:
        audio = event.get("audio")
        kind = self.config.input_format
        if not isinstance(audio, str):
            raise EventError("invalid_value", f"audio: base64 {kind} mono expected", param="audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("invalid_value", "audio: not valid base64", param="audio") from None
        if (wrong := self.wire_audio.check(kind, data)) is not None:
            raise EventError("invalid_value", f"audio: {wrong}", "audio")
        if not self.audio_rate.allow(cost=len(data) / bytes_per_second(kind)):
            raise EventError("rate_limited", "audio is arriving faster than real time; the excess is dropped", "audio")
        samples, rate = self.wire_audio.decode(kind, data)
        if self.config.turn_detection is None:  # manual: held until commit, as the front end hears it (16 kHz)
            held = sum(len(b) for b in self.buffer)
            if held + len(samples) * SAMPLE_RATE / rate > self.base.turns.max_turn_ms / 1000 * SAMPLE_RATE:
                raise EventError("buffer_full", f"the input buffer holds {self.base.turns.max_turn_ms / 1000:g} s at most; commit it")
            self.buffer.append(self.session.hear_now(samples, rate))
        else:
            self.session.push_audio(samples, arrival_ns, rate)

    def _commit(self, event: dict[str, Any], arrival_ns: int) -> None:
        if self.config.turn_detection is not None:
            raise EventError("invalid_event", "input_audio_buffer.commit: turn detection commits by itself (set it to null)")
        audio = np.concatenate(self.buffer) if self.buffer else np.zeros(0, dtype=np.float32)
        self.buffer = []
        if len(audio) < SAMPLE_RATE // 10:
            raise EventError("input_audio_buffer_commit_empty", "the input buffer holds under 100 ms of audio")
        item_id = new_id("item")
        self._native(*self.translator.committed(item_id))
        self._spawn(self._transcribe(item_id, audio))

    async def _transcribe(self, item_id: str, audio: np.ndarray) -> None:
        transcriber = self.state.stages.transcriber
        try:
            transcript = await asyncio.to_thread(transcriber.transcribe, audio)
        except (OSError, RuntimeError, ValueError) as exc:
            self._error("stage_failed", f"transcription failed: {exc}", type_="server_error")
            return
        self._native(*self.translator.transcribed(item_id, transcript.text, len(audio) / SAMPLE_RATE))
        if transcript.text:
            self.session.add_user(transcript.text)

    def _clear(self, event: dict[str, Any], arrival_ns: int) -> None:
        self.buffer = []
        self._native({"type": "input_audio_buffer.cleared"})

    def _item_create(self, event: dict[str, Any], arrival_ns: int) -> None:
        item = event.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            self._tool_output(item)
            return
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise EventError("invalid_value", "item: only message and function_call_output items are supported", param="item.type")
        role = item.get("role")
        content = item.get("content")
        if role not in ("user", "assistant") or not isinstance(content, list):
            raise EventError("invalid_value", "item: a user or assistant message with a content list", param="item.role")
        texts = [p.get("text") or p.get("transcript") for p in content if isinstance(p, dict)]
        text = " ".join(t for t in texts if isinstance(t, str)).strip()
        if not text or len(text) > P.MAX_TEXT_CHARS:
            raise EventError("invalid_value", f"item.content: text of 1 to {P.MAX_TEXT_CHARS} characters", param="item.content")
        item_id = item["id"][:64] if isinstance(item.get("id"), str) else new_id("item")
        part = {"type": "input_text", "text": text} if role == "user" else {"type": "output_text", "text": text}
        wire = {"id": item_id, "object": "realtime.item", "type": "message", "role": role, "status": "completed", "content": [part]}
        self._native(*self.translator.added(wire), {"type": "conversation.item.done", "previous_item_id": None, "item": wire})
        if role == "user":
            self.session.add_user(text)
        else:
            self.session.add_message("assistant", text)

    def _tool_output(self, item: dict[str, Any]) -> None:
        """The client's result of a function call: into the history, answered by the next response.create."""
        try:
            call_id, output = check_output(item, self.translator.open_calls)
        except ValueError as exc:
            raise EventError("invalid_value", str(exc), param=str(exc).split(":")[0]) from None
        self.translator.open_calls.discard(call_id)
        item_id = item["id"][:64] if isinstance(item.get("id"), str) else new_id("item")
        wire = {"id": item_id, "object": "realtime.item", "type": "function_call_output", "call_id": call_id,
                "output": output, "status": "completed"}  # fmt: skip
        self._native(*self.translator.added(wire), {"type": "conversation.item.done", "previous_item_id": None, "item": wire})
        self.session.add_message("tool", output)

    def _response_create(self, event: dict[str, Any], arrival_ns: int) -> None:
        self.session.respond()

    def _response_cancel(self, event: dict[str, Any], arrival_ns: int) -> None:
        turn = self.session.turns.replying_to
        if turn is None:
            raise EventError("response_cancel_not_active", "no response is in progress")
        self.translator.cancelled.add(turn)
        self.session.cancel_reply()

    def _truncate(self, event: dict[str, Any], arrival_ns: int) -> None:
        item_id, end_ms = event.get("item_id"), event.get("audio_end_ms")
        turn = self.translator.turn_of(item_id) if isinstance(item_id, str) else None
        if turn is None:
            raise EventError("invalid_value", f"item_id: no assistant item {P.clip(item_id)}", param="item_id")
        if not isinstance(end_ms, int | float) or isinstance(end_ms, bool) or not 0 <= end_ms <= 3_600_000:
            raise EventError("invalid_value", "audio_end_ms: milliseconds, 0 to one hour", param="audio_end_ms")
        self.session.truncate(turn, float(end_ms))
        self._native({"type": "conversation.item.truncated", "item_id": item_id, "content_index": 0, "audio_end_ms": int(end_ms)})

    # -- writing -----------------------------------------------------------------------------------------

    def _native(self, *events: dict[str, Any]) -> None:
        for ev in events:
            self.outbox.send(_NATIVE, event=ev)

    def _error(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None,
               type_: str = "invalid_request_error") -> None:  # fmt: skip
        self.state.metrics.error(code)
        self._native(error_event(type_, code, message, param=param, event_id=event_id))

    def _limited(self, code: str, message: str) -> None:
        """An event dropped by a limit: its error at most once a second, not once per event."""
        now = time.monotonic()
        if now - self._last_limited.get(code, 0.0) >= 1.0:
            self._last_limited[code] = now
            self._error(code, message)

    async def _flush(self, timeout_s: float = 2.0) -> None:
        """Let the writer deliver what is queued (the last error) before the close."""
        deadline = time.monotonic() + timeout_s
        while self.outbox.pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wire(self) -> dict[str, Any]:
        return self.config.to_wire(f"sess_{self.session_id}", self.model)

    async def _writer(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, OutAudio):
                events = self.translator.audio(item.turn_id, self.wire_audio.encode(self.config.output_format, item.turn_id, item.pcm16))
            elif item.body["type"] == _NATIVE:
                events = [item.body["event"]]
            else:
                events = self.translator.from_session(item.body)
            for ev in events:
                await self.ws.send_text(json.dumps({"event_id": new_id("event"), **ev}))
            if isinstance(item, OutAudio) and item.on_sent is not None:
                item.on_sent()
