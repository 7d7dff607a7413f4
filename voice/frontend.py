"""The microphone's way in: a connection's audio at whatever rate its wire carries -> the 16 kHz float32 the VAD, the
recogniser and the turn model hear, through a chain of stages (echo cancellation today; noise suppression next), and
the one clock every part of a session reads the microphone's time from.

Times are microphone time: milliseconds of the caller's audio from the first sample received, whatever the wire's rate.
Each stage takes a contiguous stream and gives one back (it may hold some audio back: its `delay_ms`, at most), so the
chain's output sample k is microphone time k / 16 kHz, however late it comes out. Adapters only decode their wire
format; resampling, the stages and the counting happen here, the same for every transport.

A pure synchronous core (`FrontEnd.run`) and a thin async step (`FrontEnd.process`) that runs a stage declared heavy
on a worker thread, so a suppressor's model never stalls the session's loop. Knows nothing of turns or sockets.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from voice.audio import SAMPLE_RATE
from voice.echo import ServerEcho
from voice.polyphase import Polyphase

MIN_RATE, MAX_RATE = 8000, 48000  # the wire rates any adapter carries (G.711's 8 kHz .. Opus's 48 kHz)


class AudioStage(Protocol):
    """One step of the chain, on 16 kHz float32."""

    name: str
    delay_ms: float  # the most audio it holds back: its output lags its input by up to this
    heavy: bool  # runs on a worker thread (a model), not on the session's loop

    def process(self, samples: np.ndarray, t_ms: float) -> np.ndarray:
        """The next samples of its input stream, the first at microphone time `t_ms` -> the next of its output's."""
        ...


class Resample:
    """The wire's rate -> 16 kHz, one stream with little delay (voice.polyphase: ~2 ms, where soxr's HQ stream held
    21 ms of a 48 kHz microphone back and 66 ms of a phone line's); its filter state is kept between chunks, so chunk
    boundaries leave no clicks and no drift from rounding each chunk's length. A new rate starts a new stream."""

    name = "resample"
    heavy = False

    def __init__(self) -> None:
        self.rate = SAMPLE_RATE
        self._stream: Polyphase | None = None  # None: 16 kHz already
        self._in_ms = self._out_ms = 0.0

    @property
    def delay_ms(self) -> float:
        """How far its output is behind its input now (the filter's delay)."""
        return max(0.0, self._in_ms - self._out_ms)

    def push(self, samples: np.ndarray, rate: int) -> np.ndarray:
        if rate != self.rate:  # what the old stream still holds is dropped with it (a few ms at a format change)
            self.rate, self._stream = rate, None if rate == SAMPLE_RATE else Polyphase(rate, SAMPLE_RATE)
            self._in_ms = self._out_ms
        out = samples if self._stream is None else self._stream.push(samples)
        self._in_ms += 1000.0 * len(samples) / rate
        self._out_ms += 1000.0 * len(out) / SAMPLE_RATE
        return out


class FrontEnd:
    """Resampling, the echo canceller (it must hear the microphone as it came, as WebRTC orders them: the replies'
    audio is its far end), then `stages` in order, counting microphone time once for all of them."""

    def __init__(self, stages: Sequence[AudioStage] = (), *, echo: ServerEcho | None = None) -> None:
        self.echo = echo
        self.stages: tuple[AudioStage, ...] = (*([echo] if echo is not None else []), *stages)
        self._resample = Resample()
        self._fed = [0] * len(self.stages)  # samples into each stage so far: its input's microphone time
        self.received_ms = 0.0  # microphone time of everything received (what a playback mark arriving now meets)
        self.heard_ms = 0.0  # microphone time of everything out of the chain

    @property
    def delay_ms(self) -> float:
        """The most the chain holds back: what its output lags the microphone by, the queue aside."""
        return self._resample.delay_ms + sum(s.delay_ms for s in self.stages)

    def stage_delay_ms(self, name: str) -> float | None:
        """The delay of the stage of that name, or None when the chain has none."""
        return next((s.delay_ms for s in self.stages if s.name == name), None)

    def receive(self, samples: np.ndarray, rate: int) -> float:
        """A message's samples have arrived (before any queue) -> the microphone time of its first sample."""
        if not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError(f"sample rate {rate} Hz is not one of {MIN_RATE}..{MAX_RATE} Hz")
        t_ms = self.received_ms
        self.received_ms += 1000.0 * len(samples) / rate
        return t_ms

    def run(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """The whole chain, here and now: the next received samples -> the next 16 kHz samples to hear."""
        out = self._resample.push(np.asarray(samples, np.float32), rate)
        for i in range(len(self.stages)):
            out = self._step(i, out)
        self.heard_ms += 1000.0 * len(out) / SAMPLE_RATE
        return out

    async def process(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """`run`, with each heavy stage on a worker thread (one call at a time: the stages keep stream state)."""
        if not any(s.heavy for s in self.stages):
            return self.run(samples, rate)
        out = self._resample.push(np.asarray(samples, np.float32), rate)
        for i, stage in enumerate(self.stages):
            out = await asyncio.to_thread(self._step, i, out) if stage.heavy else self._step(i, out)
        self.heard_ms += 1000.0 * len(out) / SAMPLE_RATE
        return out

    def _step(self, i: int, samples: np.ndarray) -> np.ndarray:
        t_ms = 1000.0 * self._fed[i] / SAMPLE_RATE
        self._fed[i] += len(samples)
        return self.stages[i].process(samples, t_ms)
