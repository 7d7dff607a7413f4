"""Voice activity detection: a `Vad` protocol with WebRTC and Silero backends (per-frame speech probability).

Backends know one frame of 16 kHz float32 audio at a time; turn logic lives in `voice.endpointer`
(re-exported here). Frame sizes: WebRTC takes 10/20/30 ms frames; Silero takes exactly 512 samples
at 16 kHz, i.e. 32 ms. Feed each backend from a `Framer(16000, vad.frame_ms)`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from voice.audio import float_to_pcm16
from voice.endpointer import (  # noqa: F401  (re-exported: the endpointer is part of this stage's API)
    Endpointer,
    EndpointEvent,
    SpeechEnded,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    VadTiming,
)


class Vad(VadTiming, Protocol):  # frame_ms; end_lag_ms: how long it says "speech" after speech stops
    sample_rate: int

    def speech_prob(self, frame: np.ndarray) -> float:
        """Probability that this frame (float32 [frame_ms * sample_rate / 1000]) holds speech."""
        ...

    def reset(self) -> None:
        """Forget recurrent state; call between streams."""
        ...


def _check_frame(frame: np.ndarray, expected: int, name: str) -> None:
    if frame.ndim != 1 or len(frame) != expected:
        raise ValueError(f"{name} expects a mono frame of {expected} samples, got shape {frame.shape}")


class WebRtcVad:
    """Google's WebRTC GMM VAD: cheap, no model file; its answer is binary, so prob is 0.0 or 1.0.

    Aggressiveness 2 by default: on the TTS corpus clips (known bounds) it found start and end within
    60 ms, where mode 3 cut quiet word endings by up to 200 ms and mode 1 ran on by up to 180 ms.
    After speech the WebRTC core holds its decision for a few frames (its "overhang"; measured
    about 60 ms), reported as `end_lag_ms`.
    """

    end_lag_ms = 60.0

    def __init__(self, aggressiveness: int = 2, sample_rate: int = 16000, frame_ms: int = 30) -> None:
        import webrtcvad  # lazy: keeps `import voice.vad` free of native loads

        if frame_ms not in (10, 20, 30):
            raise ValueError("WebRTC VAD frames must be 10, 20 or 30 ms")
        if sample_rate not in (8000, 16000, 32000, 48000):
            raise ValueError("WebRTC VAD supports 8, 16, 32 or 48 kHz")
        self.frame_ms = frame_ms
        self.sample_rate = sample_rate
        self.aggressiveness = aggressiveness
        self._new_vad = lambda: webrtcvad.Vad(aggressiveness)
        self._vad = self._new_vad()
        self._frame_samples = sample_rate * frame_ms // 1000

    def speech_prob(self, frame: np.ndarray) -> float:
        _check_frame(frame, self._frame_samples, "WebRtcVad")
        return 1.0 if self._vad.is_speech(float_to_pcm16(frame), self.sample_rate) else 0.0

    def reset(self) -> None:
        # the core adapts its noise and speech models as it goes; a new stream must not inherit them
        # (reusing one across clips moved detected starts 250 ms early)
        self._vad = self._new_vad()


class SileroVad:
    """Silero VAD v6 on onnxruntime: 512-sample (32 ms) frames at 16 kHz; keeps its RNN state and the
    64-sample context between calls, so frames of one stream must arrive in order; reset() between streams.

    onnxruntime rather than the TorchScript copy: torch's OpenMP pool is per calling thread, and a second
    pool (the event loop's, for the VAD) makes every pool throttle its spin-waits, which cost the LLM engine
    thread ~40 % of its decode rate. One intra-op thread: a 32 ms frame takes well under a millisecond.
    """

    frame_ms = 32
    sample_rate = 16000
    end_lag_ms = 32.0  # its recurrent state keeps the probability up for about one frame after speech
    _FRAME_SAMPLES = 512
    _CONTEXT = 64  # samples of the previous frame the model sees before each new one

    def __init__(self, model_path: str | Path) -> None:
        import onnxruntime  # lazy: keeps `import voice.vad` free of native loads

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        self._sr = np.array(self.sample_rate, dtype=np.int64)
        self.reset()

    def speech_prob(self, frame: np.ndarray) -> float:
        _check_frame(frame, self._FRAME_SAMPLES, "SileroVad")
        x = np.concatenate([self._context, np.asarray(frame, dtype=np.float32)])[None, :]  # [1, 576]
        prob, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": self._sr})
        self._context = x[0, -self._CONTEXT :]
        return float(prob[0, 0])

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(self._CONTEXT, dtype=np.float32)
