"""A scripted real-time voice client for the benchmarks: a microphone that never stops (speech, else silence,
in 20 ms frames at wall-clock pace), a player that 'plays' reply audio at its real duration, one result per turn.

Builds on desktop.connection (handshake) and web.protocol (audio header). Knows the wire, not the server.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from desktop.connection import Connection, ConnectionLost, ServerInfo, ws_url
from web.protocol import PlaybackMark, unpack_audio

RATE = 16000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
_SILENCE = bytes(FRAME_SAMPLES * 2)
MAX_FRAMES_PER_MESSAGE = 25  # 500 ms: well inside the protocol's 1 s a message
GREETING_WAIT_S = 3.0  # a greeting's first message comes well within this, even on a busy CPU


@dataclass(frozen=True)
class Prompt:
    """A spoken request: 16 kHz float32 [N] audio and where its speech ends inside the clip."""

    text: str
    voice: str
    audio: np.ndarray = field(repr=False)
    speech_end_ms: float

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.audio) / RATE


@dataclass(frozen=True)
class TurnResult:
    """One user turn as the client saw it. `client_v2v_ms`: last voiced sample sent -> first reply audio received.
    `reply_gap_ms`: the longest silence inside the reply when its audio plays as it arrives (audio that came
    after what was already received had played out: the speech stalled)."""

    session: int
    index: int
    prompt: str
    voice: str
    turn_id: int | None
    transcript: str
    reply: str
    client_v2v_ms: float | None
    trace: dict[str, Any] | None
    error: str | None = None
    reply_gap_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


@dataclass
class _Turn:
    """What the reader has gathered about one server turn id."""

    final: str | None = None
    reply: str = ""
    first_audio_s: float | None = None
    longest_gap_s: float = 0.0  # the longest wait for more reply audio after what had come played out
    trace: dict[str, Any] | None = None
    done: bool = False

    @property
    def replying(self) -> bool:
        return self.first_audio_s is not None or bool(self.reply)


class ScriptedSession:
    """One conversation: `await run(prompts)` speaks each prompt after the previous reply has finished playing."""

    def __init__(self, server: str, *, session: int = 0, token: str | None = None, persona: str | None = None,
                 voice: str | None = None, turn_timeout_s: float = 60.0, gap_ms: float = 400.0,
                 on_result: Callable[[TurnResult], None] | None = None) -> None:
        self.url = ws_url(server)
        self.session = session
        self.token = token
        self.persona = persona
        self.voice = voice
        self.turn_timeout_s = turn_timeout_s
        self.gap_ms = gap_ms  # silence between the reply's end and the next question: a person's pause
        self.on_result = on_result  # progress: called with each finished turn
        self.info: ServerInfo | None = None
        self.errors: list[dict[str, Any]] = []  # the server's `error` messages
        self.results: list[TurnResult] = []  # grows turn by turn, so a cancelled run keeps what it finished
        self._conn: Connection | None = None
        self._frames: deque[tuple[bytes, bool]] = deque()  # (pcm16 frame, is it the prompt's last voiced frame)
        self._last_voiced_sent_s: float | None = None
        self._turns: dict[int, _Turn] = {}
        self._traces: list[int] = []  # turn ids in the order their traces arrived
        self._max_turn_id = -1  # the highest turn id any server message has named so far
        self._play_until_s = 0.0  # when the player will have played every reply sample received so far
        self._changed = asyncio.Event()
        self._closed = False

    async def run(self, prompts: Sequence[Prompt]) -> list[TurnResult]:
        self._conn = Connection(self.url, self.token, sample_rate=RATE, open_timeout_s=30.0)
        self.info = await self._conn.open(self.persona, self.voice)
        tasks = [asyncio.create_task(self._microphone()), asyncio.create_task(self._reader())]
        try:
            await self._greeting()
            for i, prompt in enumerate(prompts):
                self.results.append(await self._turn(i, prompt))
                if self.on_result is not None:
                    self.on_result(self.results[-1])
                if self.results[-1].error is not None:
                    break  # a late reply would land in the next turn: the rest of this conversation is not spoken
            return self.results
        finally:
            self._closed = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._conn.close()

    async def _turn(self, index: int, prompt: Prompt) -> TurnResult:
        floor = self._max_turn_id  # every turn named before this prompt belongs to an earlier one
        end_frame = min(len(prompt.audio) // FRAME_SAMPLES, int(prompt.speech_end_ms * RATE / 1000) // FRAME_SAMPLES)
        for k, i in enumerate(range(0, len(prompt.audio), FRAME_SAMPLES)):
            frame = pcm16(prompt.audio[i : i + FRAME_SAMPLES])
            self._frames.append((frame + _SILENCE[len(frame) :], k == end_frame))
        self._last_voiced_sent_s = None
        error: str | None = None
        try:
            await self._wait(lambda: self._trace_after(floor) is not None, self.turn_timeout_s)
        except TimeoutError:
            error = f"no turn.trace within {self.turn_timeout_s:.0f} s"
        except ConnectionLost as exc:
            error = f"connection lost: {exc}"
        turn_id = self._trace_after(floor)
        turn = self._turns.get(turn_id, _Turn()) if turn_id is not None else _Turn()
        sent = self._last_voiced_sent_s
        v2v = None if turn.first_audio_s is None or sent is None else 1000.0 * (turn.first_audio_s - sent)
        if error is None:
            try:
                await self._settle(self.turn_timeout_s)
            except (TimeoutError, ConnectionLost) as exc:
                error = f"reply did not finish: {exc!r}"
        return TurnResult(self.session, index, prompt.text, prompt.voice, turn_id, turn.final or "", turn.reply,
                          v2v, turn.trace, error, round(1000.0 * turn.longest_gap_s, 1))

    def _trace_after(self, floor: int) -> int | None:
        return next((t for t in self._traces if t > floor), None)

    async def _greeting(self) -> None:
        """Listen to the persona's greeting, if it has one (it starts at once), before the first question."""
        try:
            await self._wait(lambda: bool(self._turns), GREETING_WAIT_S)
        except TimeoutError:
            return
        await self._settle(self.turn_timeout_s)

    async def _settle(self, timeout_s: float) -> None:
        """Wait until no reply is pending and the player has played it out, then a person's pause."""
        await self._wait(lambda: all(t.done for t in self._turns.values() if t.replying), timeout_s)
        await asyncio.sleep(max(0.0, self._play_until_s - time.perf_counter()) + self.gap_ms / 1000.0)

    async def _wait(self, ready: Any, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not ready():
                if self._closed:
                    raise ConnectionLost("closed")
                self._changed.clear()
                await self._changed.wait()

    async def _microphone(self) -> None:
        """20 ms a frame on the wall clock, like a browser's capture worklet; silence when nobody speaks.

        When this loop falls behind (a busy CPU), the frames now due go out as one message, as a browser's
        queued worklet messages would, rather than as a burst the server's rate limit refuses."""
        assert self._conn is not None
        t0 = time.perf_counter()
        sent = 0
        while True:
            due = min(MAX_FRAMES_PER_MESSAGE, max(1, int((time.perf_counter() - t0) * 1000 / FRAME_MS) - sent))
            batch = [self._frames.popleft() if self._frames else (_SILENCE, False) for _ in range(due)]
            await self._conn.send_audio(b"".join(frame for frame, _ in batch))
            if any(last for _, last in batch):
                self._last_voiced_sent_s = time.perf_counter()
            sent += due
            ahead_s = t0 + sent * FRAME_MS / 1000.0 - time.perf_counter()
            if ahead_s > 0:
                await asyncio.sleep(ahead_s)

    async def _reader(self) -> None:
        assert self._conn is not None
        try:
            while True:
                raw = await self._conn.recv()
                now = time.perf_counter()
                if isinstance(raw, bytes):
                    await self._on_audio(raw, now)
                else:
                    self._on_message(json.loads(raw))
                self._changed.set()
        except ConnectionLost:
            self._closed = True
            self._changed.set()

    async def _on_audio(self, raw: bytes, now: float) -> None:
        assert self.info is not None and self._conn is not None
        turn_id, _seq, pcm = unpack_audio(raw)
        self._max_turn_id = max(self._max_turn_id, turn_id)
        turn = self._turns.setdefault(turn_id, _Turn())
        if turn.first_audio_s is None:
            turn.first_audio_s = now
            # playback starts at once (no jitter buffer): tell the server, as the browser does
            await self._conn.send_json(PlaybackMark(type="playback.mark", turn_id=turn_id, played_ms=0.0))
        else:
            turn.longest_gap_s = max(turn.longest_gap_s, now - self._play_until_s)
        self._play_until_s = max(self._play_until_s, now) + len(pcm) / 2 / self.info.output_sample_rate

    def _on_message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "error":
            self.errors.append(msg)
            return
        turn_id = msg.get("turn_id")
        if turn_id is None:
            return
        self._max_turn_id = max(self._max_turn_id, int(turn_id))
        turn = self._turns.setdefault(int(turn_id), _Turn())
        if kind == "transcript.final":
            turn.final = str(msg["text"])
        elif kind == "response.text.delta":
            turn.reply += str(msg["text"])
        elif kind == "response.done":
            turn.done = True
        elif kind == "turn.trace":
            turn.trace = {k: v for k, v in msg.items() if k != "type"}
            turn.done = turn.done or "interrupted" in msg.get("marks_ms", {})
            if not msg.get("no_words"):  # speech heard as no words (a breath, a knock) is not the prompt's turn
                self._traces.append(int(turn_id))
