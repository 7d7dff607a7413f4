"""The audio of a WebRTC call (aiortc; Opus through PyAV): the reply as an outgoing track that hands the encoder
one 20 ms frame at 48 kHz per 20 ms of wall time (silence between replies; a reply up to 120 ms ahead,
web.webrtc_pacing), whose queue a barge-in clears and which says how much of each reply it has played; and the
microphone track read into 16 kHz mono for the session, lost packets concealed (web.webrtc_loss).
"""
from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from voice import codec
from web.webrtc_loss import Concealer
from web.webrtc_pacing import Pacer

OPUS_RATE = 48000
FRAME_MS = 20
FRAME_SAMPLES = OPUS_RATE * FRAME_MS // 1000  # 960
MARK_EVERY_MS = 200.0  # how often the played amount of a reply is reported while it plays


class ReplyTrack(MediaStreamTrack):
    """The server's voice. `push` queues a reply's PCM (any rate); `recv` (the encoder's pull) returns the next
    20 ms, paced to the wall clock with a reply's audio a little ahead (web.webrtc_pacing); `on_played(turn,
    played_ms)` reports playback as it is sent."""

    kind = "audio"

    def __init__(self, source_rate: int, on_played: Callable[[int, float], None] = lambda turn, ms: None) -> None:
        super().__init__()
        self.source_rate = source_rate
        self.on_played = on_played
        self._queue: deque[tuple[int, np.ndarray]] = deque()  # (turn, int16 samples at 48 kHz)
        self._resampler: tuple[int, codec.Resampler] | None = None
        self._cleared: deque[int] = deque(maxlen=8)
        self._turn: int | None = None  # the reply being played, how much of it, and how much was reported
        self._played_ms = self._reported_ms = 0.0
        self.pacer = Pacer(FRAME_MS / 1000.0)
        self._pts = 0

    def push(self, turn_id: int, samples: np.ndarray) -> None:
        """A piece of a reply, float32 at `source_rate`."""
        if turn_id in self._cleared:
            return
        if self._resampler is None or self._resampler[0] != turn_id:
            self._resampler = (turn_id, codec.Resampler(self.source_rate, OPUS_RATE))
        wide = self._resampler[1].push(samples)
        if wide.size:
            self._queue.append((turn_id, np.round(np.clip(wide, -1, 1) * 32767).astype(np.int16)))

    def clear(self, turn_id: int) -> None:
        """A barge-in: the turn's queued audio is dropped, its later pieces too."""
        self._cleared.append(turn_id)
        self._queue = deque(item for item in self._queue if item[0] != turn_id)
        if self._turn == turn_id:
            self._report()

    def queued_ms(self) -> float:
        return 1000.0 * sum(len(s) for _, s in self._queue) / OPUS_RATE

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now_s = time.monotonic()
        wait_s = self.pacer.due_s(now_s, audio=bool(self._queue)) - now_s
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        frame = av.AudioFrame.from_ndarray(self._take().reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        self._pts += FRAME_SAMPLES
        return frame

    def _take(self) -> np.ndarray:
        out = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            turn_id, samples = self._queue[0]
            if turn_id != self._turn:
                self._report()
                self._turn, self._played_ms, self._reported_ms = turn_id, 0.0, 0.0
            n = min(FRAME_SAMPLES - filled, len(samples))
            out[filled : filled + n] = samples[:n]
            filled += n
            if n == len(samples):
                self._queue.popleft()
            else:
                self._queue[0] = (turn_id, samples[n:])
            self._played_ms += 1000.0 * n / OPUS_RATE
        if not self._queue or self._played_ms - self._reported_ms >= MARK_EVERY_MS:
            self._report()
        return out

    def _report(self) -> None:
        if self._turn is not None and self._played_ms > self._reported_ms:
            self._reported_ms = self._played_ms
            self.on_played(self._turn, self._played_ms)


async def read_microphone(track: MediaStreamTrack, push: Callable[[np.ndarray, int], None]) -> None:
    """Decoded frames of the caller's track, as mono float32 at the track's rate (the session's front end resamples),
    until the track ends; the time of a packet lost on the way concealed (web.webrtc_loss), so the session's timeline
    keeps to the caller's."""
    concealer = Concealer(OPUS_RATE)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        pcm = frame.to_ndarray()  # packed: [1, samples x channels]; planar: [channels, samples]
        channels = len(frame.layout.channels)
        samples = pcm.T if frame.format.is_planar else pcm.reshape(-1, channels)
        scale = 32768.0 if pcm.dtype == np.int16 else 1.0
        mono = (samples.astype(np.float32).mean(axis=1) / scale).astype(np.float32)
        if concealer.sample_rate != frame.sample_rate:
            concealer = Concealer(frame.sample_rate)
        if frame.pts is not None and frame.time_base is not None:  # a lost packet's time is filled, not skipped
            mono = concealer.push(int(round(frame.pts * frame.time_base * frame.sample_rate)), mono)
        push(mono, frame.sample_rate)
