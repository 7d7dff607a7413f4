"""Endpointer: turns per-frame speech probabilities into speech start / pause / resume / end events.

A pure state machine over (prob, audio time): no audio, no models, no clocks, no I/O.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class VadTiming(Protocol):
    """What an endpointer takes from a VAD backend (voice.vad.Vad has it): its frame and how long it keeps saying
    "speech" after speech stops."""

    frame_ms: int
    end_lag_ms: float


@dataclass(frozen=True)
class SpeechStarted:
    t_ms: float  # audio time of the first voiced sample of the run that qualified


@dataclass(frozen=True)
class SpeechPaused:
    t_ms: float  # first silent frame after speech: the hangover starts (ahead-of-endpoint work starts here)


@dataclass(frozen=True)
class SpeechResumed:
    t_ms: float  # speech came back during the hangover


@dataclass(frozen=True)
class SpeechEnded:
    t_ms: float  # audio time of the end of the last voiced frame; emitted once the hangover has passed


EndpointEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechEnded


class _State(enum.Enum):
    IDLE = "idle"  # no turn; counting a candidate voiced run
    SPEAKING = "speaking"
    HANGOVER = "hangover"  # silence after speech, not yet long enough to end the turn


class Endpointer:
    """Speech starts after `min_speech_ms` of consecutive voiced frames; ends after `hangover_ms` of silence.

    `push(prob, t_ms)` takes one frame's speech probability and the audio time of the frame's first
    sample (frames are `frame_ms` long and arrive in order). A frame is voiced when
    prob >= threshold; while speaking it stays voiced down to `neg_threshold` (hysteresis, so a
    probabilistic VAD hovering at the threshold does not chop a word). Runs shorter than
    `min_speech_ms` (a cough, a click, "uh") never start a turn, which is also what keeps a short
    backchannel from barging in.

    `end_lag_ms` is how long the VAD itself keeps saying "speech" after speech stops (its own
    smoothing); SpeechEnded is moved back by it so the timestamp is the end of speech, not of the
    VAD's afterglow. `Endpointer.for_vad` takes it from the backend's `end_lag_ms` attribute.
    """

    def __init__(
        self,
        frame_ms: float,
        threshold: float = 0.5,
        min_speech_ms: float = 200.0,
        hangover_ms: float = 600.0,
        neg_threshold: float | None = None,
        end_lag_ms: float = 0.0,
    ) -> None:
        if frame_ms <= 0 or min_speech_ms < 0 or hangover_ms < 0:
            raise ValueError("frame_ms must be > 0, min_speech_ms and hangover_ms >= 0")
        self.frame_ms = float(frame_ms)
        self.threshold = threshold
        self.neg_threshold = threshold if neg_threshold is None else min(neg_threshold, threshold)
        self.min_speech_ms = float(min_speech_ms)
        self.hangover_ms = float(hangover_ms)
        self.end_lag_ms = float(end_lag_ms)
        self.reset()

    @classmethod
    def for_vad(
        cls,
        vad: VadTiming,
        threshold: float = 0.5,
        min_speech_ms: float = 200.0,
        hangover_ms: float = 600.0,
        neg_threshold: float | None = None,
    ) -> "Endpointer":
        """An endpointer matched to a VAD backend's frame size and decision lag (0 when it has none)."""
        return cls(
            vad.frame_ms,
            threshold,
            min_speech_ms,
            hangover_ms,
            neg_threshold,
            end_lag_ms=float(vad.end_lag_ms),
        )

    def reset(self) -> None:
        self._state = _State.IDLE
        self._run_start_ms: float | None = None  # first frame of the current voiced run (IDLE)
        self._run_ms = 0.0
        self._speech_start_ms = 0.0
        self._last_voiced_end_ms = 0.0
        self._silence_start_ms = 0.0

    @property
    def in_speech(self) -> bool:
        """True from SpeechStarted until SpeechEnded (hangover included)."""
        return self._state is not _State.IDLE

    @property
    def speech_end_ms(self) -> float:
        """Where SpeechEnded would put the end of the current speech: its last voiced frame, less the VAD's lag."""
        return max(self._speech_start_ms, self._last_voiced_end_ms - self.end_lag_ms)

    def end(self) -> None:
        """The turn was ended by a decision before the hangover ran out: back to waiting for speech."""
        self.reset()

    def push(self, prob: float, t_ms: float) -> list[EndpointEvent]:
        end_ms = t_ms + self.frame_ms
        if self._state is _State.IDLE:
            return self._push_idle(prob >= self.threshold, t_ms, end_ms)
        voiced = prob >= self.neg_threshold
        if self._state is _State.SPEAKING:
            if voiced:
                self._last_voiced_end_ms = end_ms
                return []
            self._state = _State.HANGOVER
            self._silence_start_ms = t_ms
            return [SpeechPaused(t_ms)] + self._maybe_end(end_ms)
        # HANGOVER: coming back needs a frame over the full threshold, not the hysteresis one
        if prob >= self.threshold:
            self._state = _State.SPEAKING
            self._last_voiced_end_ms = end_ms
            return [SpeechResumed(t_ms)]
        return self._maybe_end(end_ms)

    def _push_idle(self, voiced: bool, t_ms: float, end_ms: float) -> list[EndpointEvent]:
        if not voiced:
            self._run_start_ms, self._run_ms = None, 0.0
            return []
        if self._run_start_ms is None:
            self._run_start_ms = t_ms
        self._run_ms += self.frame_ms
        if self._run_ms < self.min_speech_ms:
            return []
        self._state = _State.SPEAKING
        self._last_voiced_end_ms = end_ms
        start = self._speech_start_ms = self._run_start_ms
        self._run_start_ms, self._run_ms = None, 0.0
        return [SpeechStarted(start)]

    def _maybe_end(self, end_ms: float) -> list[EndpointEvent]:
        if end_ms - self._silence_start_ms < self.hangover_ms:
            return []
        self._state = _State.IDLE
        return [SpeechEnded(self.speech_end_ms)]
