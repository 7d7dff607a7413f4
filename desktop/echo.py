"""Keeps the assistant's own voice, leaking from speaker to microphone, from reaching the server.

Three modes: `aec` (WebRTC AEC3 through the optional pywebrtc-audio package), `guard` (half-duplex:
while the assistant speaks, only louder and longer speech gets through, and it interrupts), and
`off` (headphones). Works on 16 kHz float32 mono blocks; knows nothing of devices or the wire.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from desktop.fifo import SampleFifo
from voice.echo import aec_available  # one check for both cancellers (the server's and this client's)

EchoMode = Literal["aec", "guard", "off"]
RATE = 16000


def level_dbfs(block: np.ndarray) -> float:
    """RMS level of a float block in dB relative to full scale; -120 for silence."""
    if len(block) == 0:
        return -120.0
    rms = float(np.sqrt(np.mean(np.square(block, dtype=np.float64))))
    return 20.0 * np.log10(rms) if rms > 1e-6 else -120.0


@dataclass(frozen=True)
class Capture:
    audio: np.ndarray  # float32 [n] to send (n may exceed the input block when held audio is released)
    barge_in: bool  # the user is interrupting: stop playback now and tell the server


class EchoControl(Protocol):
    mode: EchoMode

    def render(self, far: np.ndarray) -> None:
        """What the speaker is playing now (16 kHz), called from the audio thread."""

    def capture(self, near: np.ndarray, speaking: bool) -> Capture:
        """One microphone block (16 kHz); `speaking` is whether assistant audio is playing."""


class NoEcho:
    """Headphones: the microphone cannot hear the speaker, pass everything through."""

    mode: EchoMode = "off"

    def render(self, far: np.ndarray) -> None:
        return None

    def capture(self, near: np.ndarray, speaking: bool) -> Capture:
        return Capture(near, False)


class WebRtcAec:
    """WebRTC AEC3 (the browser's echo canceller) subtracts the speaker signal from the microphone;
    the server's own barge-in rule then decides whether what is left interrupts."""

    mode: EchoMode = "aec"

    def __init__(self, stream_delay_ms: int = 0) -> None:
        from pywebrtc_audio import EchoCanceller

        self._aec = EchoCanceller(sample_rate=RATE, num_channels=1, stream_delay_ms=stream_delay_ms)
        self._far = SampleFifo(max_samples=RATE // 2)  # bounded: a stalled microphone cannot grow it

    def render(self, far: np.ndarray) -> None:
        self._far.push(far)

    def capture(self, near: np.ndarray, speaking: bool) -> Capture:
        if not len(near):
            return Capture(near, False)
        far = self._far.take(len(near))
        clean = self._aec.process(np.asarray(near, np.float32), far)
        return Capture(np.asarray(clean, np.float32), False)


@dataclass(frozen=True)
class GuardConfig:
    margin_db: float = 8.0  # speech must beat the expected echo by this much
    floor_dbfs: float = -40.0  # and be at least this loud
    min_speech_ms: int = 300  # loud for this long (the server's barge-in rule asks 300 ms of any speech)
    window_ms: int = 800  # ... counted over this window: words have gaps, and echo fills some of them
    tail_ms: int = 250  # the room and the device still echo after the last sample
    preroll_ms: int = 800  # held-back audio released on barge-in so recognition hears the start


class HalfDuplexGuard:
    """While the assistant speaks the microphone is replaced by silence, unless the user speaks
    clearly louder than the learnt echo for `min_speech_ms`: then the held audio is released and
    the client interrupts. The echo coupling (mic dB minus the speaker's recent peak dB) is learnt
    from blocks that do not look like the user, starting from 0 dB (echo as loud as the speaker)."""

    mode: EchoMode = "guard"

    def __init__(self, cfg: GuardConfig = GuardConfig(), block_ms: int = 20) -> None:
        self.cfg = cfg
        self._block_ms = block_ms
        self.coupling_db = 0.0
        self._far_db: collections.deque[float] = collections.deque(maxlen=10)  # ~200 ms of speaker level: covers device + room delay
        self._far = SampleFifo(max_samples=RATE // 2)  # bounded: a stalled microphone cannot grow it
        self._loud: collections.deque[bool] = collections.deque(maxlen=max(1, cfg.window_ms // block_ms))
        self._held: collections.deque[np.ndarray] = collections.deque(maxlen=max(1, cfg.preroll_ms // block_ms))
        self._quiet_ms = float(cfg.tail_ms)  # time since the assistant last spoke
        self._open = False  # the user has interrupted; pass audio until the assistant is quiet

    def render(self, far: np.ndarray) -> None:
        self._far.push(far)

    def _learn(self, near_db: float, far_db: float) -> None:
        """Track the loud end of (mic dB - speaker dB): echo between words is much quieter than the
        speaker's recent peak, and an average would let the next word's echo through. So rise
        faster than fall; a block more than 3 dB over the estimate is taken for the user, not echo,
        and ignored (else talking over the assistant would teach the guard to ignore the user). A
        near-silent microphone teaches nothing."""
        if far_db <= -60.0 or near_db <= self.cfg.floor_dbfs - 20.0:
            return
        ratio = near_db - far_db
        if ratio > self.coupling_db + 3.0:
            return
        rate = 0.1 if ratio > self.coupling_db else 0.02
        self.coupling_db = min(max(self.coupling_db + rate * (ratio - self.coupling_db), -40.0), 6.0)

    def capture(self, near: np.ndarray, speaking: bool) -> Capture:
        block_ms = len(near) * 1000 / RATE
        far = self._far.take(len(near))
        self._far_db.append(level_dbfs(far))
        self._quiet_ms = 0.0 if speaking else self._quiet_ms + block_ms
        if self._quiet_ms >= self.cfg.tail_ms:
            self._open = False
            self._loud.clear()
            self._held.clear()
            return Capture(near, False)
        if self._open:
            return Capture(near, False)
        near_db = level_dbfs(near)
        far_db = max(self._far_db)
        expected = far_db + self.coupling_db
        loud = near_db >= max(self.cfg.floor_dbfs, expected + self.cfg.margin_db)
        self._learn(near_db, far_db)
        self._loud.append(loud)
        self._held.append(near)
        needed = self.cfg.min_speech_ms / self._block_ms
        if loud and sum(self._loud) >= needed:
            self._open = True
            released = np.concatenate(list(self._held))
            self._held.clear()
            return Capture(released, True)
        return Capture(np.zeros_like(near), False)


def make_echo_control(mode: EchoMode | Literal["auto"], block_ms: int = 20) -> EchoControl:
    """`auto` is AEC when pywebrtc-audio is installed, else the half-duplex guard."""
    if mode == "auto":
        mode = "aec" if aec_available() else "guard"
    if mode == "aec":
        return WebRtcAec()
    if mode == "guard":
        return HalfDuplexGuard(block_ms=block_ms)
    return NoEcho()
