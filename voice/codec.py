"""Telephone audio: G.711 μ-law and A-law (ITU-T G.711) to and from PCM16 with numpy, and a streaming soxr resampler
for 8 kHz <-> the 16 kHz the stages hear and the rates replies are spoken at. Used by the Twilio adapter
(web.twilio) and the Realtime API's `audio/pcmu` / `audio/pcma` (web.realtime). Sample arithmetic only.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import soxr

G711_RATE = 8000  # G.711 is narrowband: 8 kHz, one byte a sample
Law = Literal["pcmu", "pcma"]

_ULAW_BIAS = 33  # on the 14-bit magnitude
_ULAW_MAX = 8158  # the largest 14-bit magnitude that fits segment 7 once biased (8158 + 33 = 2^13 - 1)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _pcm16(samples: np.ndarray | bytes) -> np.ndarray:
    if isinstance(samples, bytes | bytearray | memoryview):
        if len(samples) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(samples)}")
        return np.frombuffer(samples, dtype="<i2").astype(np.int32)
    return np.asarray(samples).astype(np.int32)


def ulaw_encode(samples: np.ndarray | bytes) -> bytes:
    """PCM16 (int16 array or little-endian bytes) -> μ-law bytes, one a sample."""
    v = _pcm16(samples) >> 2  # the 14-bit linear value G.711 μ-law codes
    negative = v < 0
    biased = np.minimum(np.where(negative, -v, v), _ULAW_MAX) + _ULAW_BIAS  # 33 .. 8191
    segment = np.floor(np.log2(biased)).astype(np.int32) - 5  # biased lies in [2^(seg+5), 2^(seg+6))
    mantissa = (biased >> (segment + 1)) & 0x0F
    code = (segment << 4) | mantissa
    return (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes -> int16 [N]."""
    return _ULAW_TABLE[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(samples: np.ndarray | bytes) -> bytes:
    """PCM16 (int16 array or little-endian bytes) -> A-law bytes, one a sample."""
    v = _pcm16(samples) >> 3  # the 13-bit linear value G.711 A-law codes
    positive = v >= 0
    magnitude = np.where(positive, v, -v - 1)
    segment = np.searchsorted(_ALAW_SEG_END, magnitude, side="left").astype(np.int32)  # 8: past the last segment
    shift = np.where(segment < 2, 1, segment)
    code = np.where(segment >= 8, 0x7F, (np.minimum(segment, 7) << 4) | ((magnitude >> np.minimum(shift, 7)) & 0x0F))
    return (code ^ np.where(positive, 0xD5, 0x55)).astype(np.uint8).tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes -> int16 [N]."""
    return _ALAW_TABLE[np.frombuffer(data, dtype=np.uint8)]


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    segment, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << segment) - 0x84  # 16-bit scale: 4 x ((2m + 33) 2^seg - 33)
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    segment, mantissa = (a >> 4) & 0x07, a & 0x0F
    t = (mantissa << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = np.where(segment > 1, t << np.maximum(segment - 1, 0), t)
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW_TABLE = _ulaw_table()  # 256 entries each: the whole decoder
_ALAW_TABLE = _alaw_table()


def encode(law: Law, samples: np.ndarray) -> bytes:
    """float32 [N] in [-1, 1] (at 8 kHz) -> G.711 bytes."""
    pcm = np.round(np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16)
    return ulaw_encode(pcm) if law == "pcmu" else alaw_encode(pcm)


def decode(law: Law, data: bytes) -> np.ndarray:
    """G.711 bytes -> float32 [N] in [-1, 1) (at 8 kHz)."""
    pcm = ulaw_decode(data) if law == "pcmu" else alaw_decode(data)
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


class Resampler:
    """A stream's resampling (soxr), chunk by chunk with the filter's state kept between chunks: no clicks at
    20 ms boundaries, as resampling each chunk alone would leave. Output lags input by the filter's delay."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate, self.to_rate = from_rate, to_rate
        self._stream = None if from_rate == to_rate else soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")

    def push(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x, last=last).astype(np.float32, copy=False)
