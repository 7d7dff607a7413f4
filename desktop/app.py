"""The desktop client's conversation loop: microphone -> server, server -> speaker and view.

Owns the asyncio tasks (mic sender, receiver, playback marks) and reconnects when the server goes
away. Audio devices, echo handling, jitter buffer and view are injected; no flags, no terminal.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import soxr

from desktop.audio_io import AudioIO
from desktop.connection import Connection, ConnectError, ConnectionLost, ServerInfo, backoff_s
from desktop.echo import EchoControl, EchoMode, make_echo_control
from desktop.jitter import JitterBuffer
from desktop.latency import LatencyBook, VoicedClock
from desktop.tui import ClientView
from web.protocol import InputText, PlaybackMark, ResponseCancel, SessionUpdate, unpack_audio

SEND_RATE = 16000  # what we declare in session.start; the server's ASR rate, so it never resamples
MAX_HOLD_S = 4.0  # a hold the server never decided (it heard no speech there, or it is gone) ends by itself


@dataclass(frozen=True)
class ClientOptions:
    url: str
    token: str | None = None
    persona: str | None = None
    voice: str | None = None
    push_to_talk: bool = False
    echo: EchoMode | Literal["auto"] = "auto"
    block_ms: int = 20
    prebuffer_ms: float = 0.0  # jitter target at start: play a reply's first message as soon as it arrives
    max_prebuffer_ms: float = 200.0  # each underrun raises the target 20 ms, up to this (desktop/jitter.py)
    mark_interval_ms: float = 250.0
    reconnect_for_s: float = 120.0  # give up when a lost server has not come back for this long
    user: str | None = None  # the id a persona with memory remembers this user by (desktop/main.py keeps one)


@dataclass
class _Mic:
    queue: asyncio.Queue[tuple[np.ndarray, float]] = field(default_factory=lambda: asyncio.Queue(maxsize=100))
    dropped: int = 0


class DesktopClient:
    def __init__(self, opts: ClientOptions, audio: AudioIO, view: ClientView | None = None,
                 echo: EchoControl | None = None) -> None:
        self.opts = opts
        self.audio = audio
        self.view = view or ClientView()
        self.echo = echo or make_echo_control(opts.echo, opts.block_ms)
        self.jitter = JitterBuffer(audio.output_rate, opts.prebuffer_ms, max_prebuffer_ms=opts.max_prebuffer_ms)
        self._held_since: float | None = None  # perf_counter when playback was paused for speech over it
        self.latency = LatencyBook()
        self.voiced = VoicedClock()
        self.info: ServerInfo | None = None
        self.persona = opts.persona
        self.voice = opts.voice
        self.talking = not opts.push_to_talk
        self.connects = 0  # successful session starts, 1 + reconnects
        self.sent_ms = 0.0  # microphone audio sent in this session: the server's audio clock (its events' t_ms)
        self.events: list[dict[str, Any]] = []  # every server text message, for tests and debugging
        self.ready = asyncio.Event()
        self._conn = Connection(opts.url, opts.token, sample_rate=SEND_RATE, echo_cancelled=self.echo.mode != "off",
                                user=opts.user)  # fmt: skip
        self._mic = _Mic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._in_rs = soxr.ResampleStream(audio.input_rate, SEND_RATE, 1, dtype="float32")
        self._echo_rs = soxr.ResampleStream(audio.output_rate, SEND_RATE, 1, dtype="float32")
        self._turn_rs: dict[int, Any] = {}
        self._reply_turn = -1
        self._marked: dict[int, float] = {}
        self._typed: list[str] = []
        self.view.server = opts.url
        self.view.echo_mode = self.echo.mode
        self.view.push_to_talk = opts.push_to_talk

    # ---- commands (from the keyboard or tests) ----
    def stop(self) -> None:
        self._stopping.set()

    def set_talking(self, on: bool) -> None:
        """Push-to-talk: the microphone is sent only while on; starting to talk interrupts."""
        self.talking = on
        self.view.talking = on
        if on and self.jitter.playing():
            self._spawn(self.interrupt())

    def _hold(self, on: bool) -> None:
        """Pause playback in place (speech under a reply) or resume it (the server's response.resumed), and say so:
        the server's echo canceller follows what plays."""
        if self.jitter.held == on:
            return
        self.jitter.held = on
        self._held_since = time.perf_counter() if on else None
        for turn_id in list(self._turn_rs):
            status = self.jitter.status(turn_id)
            if status is not None and status.started_at_s is not None and not status.finished:
                mark = PlaybackMark(type="playback.mark", turn_id=turn_id, played_ms=round(status.played_ms, 1), paused=on)
                self._spawn(self._send_quiet(mark))

    async def interrupt(self) -> None:
        self.jitter.clear()
        await self._send_quiet(ResponseCancel(type="response.cancel"))

    async def set_persona(self, persona: str | None = None, voice: str | None = None) -> None:
        self.persona = persona or self.persona
        self.voice = voice or self.voice
        await self._send_quiet(SessionUpdate(type="session.update", persona=persona, voice=voice))

    async def next_persona(self) -> None:
        if self.info and self.info.personas:
            names = list(self.info.personas)
            current = self.view.persona if self.view.persona in names else names[0]
            await self.set_persona(names[(names.index(current) + 1) % len(names)])

    async def send_text(self, text: str) -> None:
        if await self._send_quiet(InputText(type="input.text", text=text)):
            self._typed.append(text)  # labels the next typed turn's latency row (it has no transcript), by its trace

    # ---- main loop ----
    async def run(self) -> int:
        """Connect, converse, reconnect; returns 0 on stop(), 1 when the server cannot be reached."""
        self._loop = asyncio.get_running_loop()
        self.audio.start(self._on_input, self._fill_output)
        try:
            return await self._sessions()
        finally:
            self.audio.stop()
            await self._conn.close()
            self.view.state = "closed"

    async def _sessions(self) -> int:
        lost_since: float | None = None
        attempt = 0
        while not self._stopping.is_set():
            try:
                self.info = await self._conn.open(self.persona, self.voice)
                self.sent_ms = 0.0
            except ConnectError as exc:
                self.view.notice = str(exc)
                give_up = lost_since is None or time.monotonic() - lost_since > self.opts.reconnect_for_s
                if not exc.retry or give_up:
                    return 1
                await self._sleep(backoff_s(attempt))
                attempt += 1
                continue
            if lost_since is not None:
                self.view.notice = "reconnected: the conversation goes on" if self._conn.resumed else \
                    "reconnected: a new conversation (the old one could not be resumed)"
            attempt, lost_since = 0, None
            self.connects += 1
            self._on_ready(self.info)
            self.ready.set()
            reason = await self._converse()
            self.ready.clear()
            self.jitter.clear()
            # Turn ids start again at 1 in the next session: a finished turn's resampler (flushed with
            # last=True) must not take the new session's audio ("Input after last input" ended the client).
            self._turn_rs.clear()
            self._marked.clear()
            if self._stopping.is_set():
                break
            self.view.state, self.view.notice = "reconnecting", f"connection lost ({reason}); reconnecting"
            lost_since = time.monotonic()
        return 0

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _converse(self) -> str:
        """Run one session until it is lost or stop() is called; returns why it ended."""
        tasks = [asyncio.create_task(c) for c in (self._send_mic(), self._receive(), self._mark_playback())]
        stop = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
        for t in (*tasks, stop):
            t.cancel()
        await asyncio.gather(*tasks, stop, return_exceptions=True)
        for t in done:
            if t is not stop and not t.cancelled() and isinstance(t.exception(), ConnectionLost):
                return str(t.exception()) or "closed"
        if not self._stopping.is_set():
            for t in done:
                if t is not stop and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]  # a bug here must not become a reconnect loop
        await self._conn.close()
        return "stopped"

    # ---- audio thread side ----
    def _on_input(self, block: np.ndarray, capture_s: float) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._queue_mic, block, capture_s)

    def _queue_mic(self, block: np.ndarray, capture_s: float) -> None:
        try:
            self._mic.queue.put_nowait((block, capture_s))
        except asyncio.QueueFull:  # the loop fell behind: old audio is worth less than new
            self._mic.queue.get_nowait()
            self._mic.queue.put_nowait((block, capture_s))
            self._mic.dropped += 1

    def _fill_output(self, n: int) -> np.ndarray:
        out = self.jitter.pull(n, time.perf_counter() + self.audio.output_latency_s)
        self.echo.render(self._echo_rs.resample_chunk(out) if self.audio.output_rate != SEND_RATE else out)
        return out

    # ---- tasks ----
    async def _send_mic(self) -> None:
        while True:
            block, capture_s = await self._mic.queue.get()
            near = self._in_rs.resample_chunk(block) if self.audio.input_rate != SEND_RATE else block
            if not len(near):  # the resampler holds back its first few samples
                continue
            cap = self.echo.capture(np.asarray(near, np.float32), self.jitter.playing())
            if cap.barge_in:  # pause what plays; the server hears the words and stops or resumes the reply
                if self.ready.is_set():
                    self._hold(True)
                else:  # no server to decide: stop it here
                    self.jitter.clear()
            # after echo handling, so the assistant's own voice does not count as the user's
            self.voiced.update(cap.audio[-len(near):], capture_s, SEND_RATE)
            audio = cap.audio if self.talking else np.zeros_like(cap.audio)
            pcm16 = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
            for i in range(0, len(pcm16), SEND_RATE * 2):  # at most 1 s a message
                await self._conn.send_audio(pcm16[i:i + SEND_RATE * 2])
                self.sent_ms += 1000.0 * len(pcm16[i:i + SEND_RATE * 2]) / 2 / SEND_RATE

    async def _receive(self) -> None:
        while True:
            raw = await self._conn.recv()
            if isinstance(raw, bytes):
                self._on_audio(raw)
            else:
                self._on_message(json.loads(raw))

    async def _mark_playback(self) -> None:
        """Tell the server how much of each turn was heard (its history keeps only that), and
        stamp mic-to-ear when a turn's first sample reached the speaker."""
        while True:
            await asyncio.sleep(self.opts.mark_interval_ms / 1000)
            for turn_id in list(self._turn_rs):
                status = self.jitter.status(turn_id)
                if status is None or status.started_at_s is None:
                    if status is not None and status.finished:  # cleared before a sample was played
                        del self._turn_rs[turn_id]
                    continue
                first = turn_id not in self._marked
                self.latency.on_playback_start(turn_id, status.started_at_s, status.start_ms,
                                               self.audio.output_latency_s * 1000.0, status.underruns)
                if self._marked.get(turn_id) != status.played_ms:
                    self._marked[turn_id] = status.played_ms
                    start_ms = round(status.start_ms, 1) if first and status.start_ms is not None else None
                    await self._conn.send_json(PlaybackMark(type="playback.mark", turn_id=turn_id,
                                                            played_ms=round(status.played_ms, 1), start_ms=start_ms,
                                                            underruns=status.underruns))
                if status.finished:
                    del self._turn_rs[turn_id]
            self.view.turns = self.latency.rows()
            held = self._held_since
            if held is not None and time.perf_counter() - held >= MAX_HOLD_S:
                self._hold(False)  # the server never decided (it heard no speech there, or it is gone): play on
            if self.view.state == "speaking" and not self.jitter.playing():
                self.view.state = "idle"

    async def _send_quiet(self, msg: Any) -> bool:
        """Commands while disconnected are dropped: the user sees 'reconnecting' and can repeat. -> sent"""
        try:
            await self._conn.send_json(msg)
        except ConnectionLost:
            self.view.notice = "not connected; try again when reconnected"
            return False
        return True

    def _spawn(self, coro: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(coro))

    # ---- server messages ----
    def _on_ready(self, info: ServerInfo) -> None:
        self.view.state, self.view.notice = "idle", ""
        self.view.persona, self.view.voice = info.persona, info.voice
        self.persona, self.voice = info.persona, info.voice

    def _on_audio(self, data: bytes) -> None:
        arrival_s = time.perf_counter()  # the client's playback start counts from here (desktop/jitter.py)
        turn_id, seq, pcm16 = unpack_audio(data)
        if self.info is None:
            return
        pcm = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        rs = self._turn_rs.get(turn_id)
        if rs is None:
            rs = self._turn_rs[turn_id] = soxr.ResampleStream(self.info.output_sample_rate, self.audio.output_rate,
                                                               1, dtype="float32")
        out = rs.resample_chunk(pcm) if self.info.output_sample_rate != self.audio.output_rate else pcm
        if self.jitter.push(turn_id, seq, out, arrival_s):
            self.view.state = "speaking"

    def _on_message(self, msg: dict[str, Any]) -> None:
        self.events.append(msg)
        kind, view = msg.get("type"), self.view
        turn_id = int(msg.get("turn_id", -1))
        if kind == "session.ready":
            self.info = ServerInfo.from_ready(msg)
            self._on_ready(self.info)
        elif kind == "session.updated":  # the answer to session.update
            self.persona = str(msg.get("persona") or self.persona)
            self.voice = str(msg.get("voice") or self.voice)
            view.persona, view.voice = self.persona, self.voice
        elif kind == "vad.speech_started":
            view.state, view.partial = "listening", ""
            if msg.get("holds") is not None and self.jitter.playing():
                self._hold(True)
        elif kind == "response.resumed":
            self._hold(False)
        elif kind == "vad.speech_ended":
            self.latency.speech_ended(self.voiced.last_voiced_end_s)
            view.state = "thinking"
        elif kind == "transcript.partial":
            view.partial = msg["text"]
        elif kind == "transcript.final":
            view.partial, view.user_text, view.state = "", msg["text"], "thinking"
            self.latency.on_final(turn_id, msg["text"])
        elif kind == "response.text.delta":
            if turn_id != self._reply_turn:
                self._reply_turn, view.reply = turn_id, ""
            view.reply += msg["text"]
        elif kind == "response.audio.clear":
            self.jitter.clear(turn_id)
            self._held_since = None
        elif kind == "response.done":
            self._flush_turn(turn_id)
            view.reply = str(msg.get("spoken_text" if msg.get("interrupted") else "text") or "")
            self.latency.on_done(turn_id, bool(msg.get("interrupted")))
        elif kind == "turn.trace":
            self.latency.on_trace(turn_id, msg.get("stages_ms", {}), msg.get("budgets_ms", {}),
                                  msg.get("over_budget", []))
            # A typed turn is known by its trace (a greeting has none, and can start after the text was sent)
            if msg.get("input") == "text" and self._typed:
                self.latency.on_typed(turn_id, self._typed.pop(0))
            view.budgets_ms = dict(self.latency.budgets_ms)
        elif kind == "error":
            view.notice = f"server: {msg.get('message')} ({msg.get('code')})"
        view.turns = self.latency.rows()

    def _flush_turn(self, turn_id: int) -> None:
        rs = self._turn_rs.get(turn_id)
        if rs is not None and self.info is not None and self.info.output_sample_rate != self.audio.output_rate:
            self.jitter.push(turn_id, 1 << 31, rs.resample_chunk(np.zeros(0, np.float32), last=True))
        self.jitter.end_turn(turn_id)
