"""Audio plumbing: PCM16 <-> float32, soxr resampling, and fixed-size framing stamped with audio time.

It knows sample arithmetic only: nothing about speech, models or sockets.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import soxr

SAMPLE_RATE = 16000  # what VAD, speech recognition and the turn model take; other client rates are resampled to it
_PCM16_SCALE = 32768.0


def pcm16_to_float(data: bytes) -> np.ndarray:
    """PCM16LE bytes -> float32 [N] in [-1, 1). Odd length is a protocol error, not a silent truncation."""
    if len(data) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
    return (np.frombuffer(data, dtype="<i2").astype(np.float32) / _PCM16_SCALE).astype(np.float32)


def float_to_pcm16(x: np.ndarray) -> bytes:
    """float32 [N] -> PCM16LE bytes; values outside [-1, 1] are clipped rather than wrapped."""
    scaled = np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0) * (_PCM16_SCALE - 1)
    return np.round(scaled).astype("<i2").tobytes()


def resample(x: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample float32 mono [N] with soxr (high quality); a no-op copy-free return when rates match."""
    x = np.asarray(x, dtype=np.float32)
    if from_rate == to_rate or x.size == 0:
        return x
    return soxr.resample(x, from_rate, to_rate).astype(np.float32, copy=False)


@dataclass(frozen=True)
class AudioFrame:
    samples: np.ndarray  # float32 [frame_samples]
    t_ms: float  # audio time of the first sample, from the start of the stream
    sample_rate: int

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.samples) / self.sample_rate

    @property
    def end_ms(self) -> float:
        return self.t_ms + self.duration_ms


@dataclass
class Framer:
    """Re-chunks arbitrary-length input into fixed frames; time counts samples, not wall clock.

    A remainder shorter than one frame waits for the next push, so frames never overlap or gap.
    """

    sample_rate: int
    frame_ms: float
    _pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32), repr=False)
    _samples_out: int = 0
    frame_samples: int = field(init=False)

    def __post_init__(self) -> None:
        n = self.sample_rate * self.frame_ms / 1000
        if n != int(n) or n <= 0:
            raise ValueError(f"{self.frame_ms} ms is not a whole number of samples at {self.sample_rate} Hz")
        self.frame_samples = int(n)

    def push(self, samples: np.ndarray) -> list[AudioFrame]:
        buf = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        n_frames = len(buf) // self.frame_samples
        frames = []
        for i in range(n_frames):
            chunk = buf[i * self.frame_samples : (i + 1) * self.frame_samples]
            t_ms = 1000.0 * self._samples_out / self.sample_rate
            frames.append(AudioFrame(chunk, t_ms, self.sample_rate))
            self._samples_out += self.frame_samples
        self._pending = buf[n_frames * self.frame_samples :].copy()
        return frames

    @property
    def t_ms(self) -> float:
        """Audio time of the next frame's first sample."""
        return 1000.0 * self._samples_out / self.sample_rate

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._samples_out = 0
