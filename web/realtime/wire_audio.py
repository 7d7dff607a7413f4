"""A Realtime connection's audio on the wire, in the formats OpenAI defines: `audio/pcm` (PCM16 24 kHz) and G.711
`audio/pcmu` / `audio/pcma` (8 kHz, a byte a sample), to samples at the wire's rate (the session's front end
resamples what it hears) and from the 24 kHz it speaks. Stateful per connection (a reply's streaming resampler); no
sockets.
"""
from __future__ import annotations

import numpy as np

from voice import codec
from voice.audio import pcm16_to_float
from web.realtime.config import RATE

_LAW: dict[str, codec.Law] = {"audio/pcmu": "pcmu", "audio/pcma": "pcma"}


def bytes_per_second(kind: str) -> int:
    return codec.G711_RATE if kind in _LAW else RATE * 2


class WireAudio:
    def __init__(self) -> None:
        self._out_key: tuple[str, int] | None = None  # (format, turn): a reply's audio is one stream
        self._out: codec.Resampler | None = None

    @staticmethod
    def decode(kind: str, data: bytes) -> tuple[np.ndarray, int]:
        """An append's bytes in `kind` -> (float32 samples, their rate). Raises ValueError for bytes that are not
        `kind`."""
        law = _LAW.get(kind)
        if law is None:
            return pcm16_to_float(data), RATE
        return codec.decode(law, data), codec.G711_RATE

    def encode(self, kind: str, turn_id: int, pcm16: bytes) -> bytes:
        """A reply's PCM16 at 24 kHz -> bytes in `kind`."""
        law = _LAW.get(kind)
        if law is None:
            return pcm16
        if self._out_key != (kind, turn_id) or self._out is None:
            self._out_key, self._out = (kind, turn_id), codec.Resampler(RATE, codec.G711_RATE)
        return codec.encode(law, self._out.push(pcm16_to_float(pcm16)))

    @staticmethod
    def check(kind: str, data: bytes) -> str | None:
        """Why `data` cannot be audio of `kind`, or None."""
        if kind not in _LAW and len(data) % 2:
            return f"odd length {len(data)}; PCM16 needs 2 bytes a sample"
        return None

