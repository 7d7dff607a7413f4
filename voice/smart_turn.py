"""The audio end-of-turn model: Smart Turn v3.2 (a Whisper-tiny encoder and a classifier, int8 ONNX) scores
whether the speech so far sounds finished, from prosody and wording together.

It knows 16 kHz float32 audio and one probability; nothing of VAD, transcripts or decisions (voice.turntaking).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from voice.audio import SAMPLE_RATE


class TurnModel(Protocol):
    def complete_prob(self, audio: np.ndarray) -> float:
        """P(the user has finished their turn) from the turn's audio so far, float32 [N] at 16 kHz, ending now
        (its trailing silence included). Synchronous; call it from a worker thread."""
        ...


def with_silence_to_come(audio: np.ndarray, silence_ms: float, check_ms: float) -> np.ndarray:
    """`audio` (ending in `silence_ms` of pause) as a check at `check_ms` of silence will hear it: the pause's
    quietest 10 ms (the room's own floor, never a word's tail) repeated for the silence still to come."""
    audio = np.asarray(audio, dtype=np.float32)
    step = SAMPLE_RATE // 100
    tail = audio[len(audio) - int(silence_ms * SAMPLE_RATE / 1000) :]
    windows = [tail[i : i + step] for i in range(0, len(tail) - step + 1, step)] or [np.zeros(step, np.float32)]
    floor = min(windows, key=lambda w: float(np.mean(np.square(w))))
    extra = int(max(0.0, check_ms - silence_ms) * SAMPLE_RATE / 1000)
    return np.concatenate([audio, np.tile(floor, -(-extra // step))[:extra]])


class SmartTurn:
    """Smart Turn v3.2 on onnxruntime with one thread (~26 ms a check on one core of the dev machine, features
    ~3 ms). Input: the last 8 s, left-padded with zeros, as Whisper log-mel features (80 bins, 10 ms hop,
    waveform normalised): `(1, 80, 800)` float32 `input_features`. Output: a sigmoid probability."""

    WINDOW_S = 8

    def __init__(self, model_path: str | Path) -> None:
        import onnxruntime  # lazy: keeps `import voice.smart_turn` free of native loads
        from transformers import WhisperFeatureExtractor

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self._session = onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        if list(inputs) != ["input_features"] or inputs["input_features"][1:] != [80, 100 * self.WINDOW_S]:
            raise ValueError(f"{model_path}: not a Smart Turn v3 model (inputs {inputs})")
        self._features = WhisperFeatureExtractor(chunk_length=self.WINDOW_S)

    def complete_prob(self, audio: np.ndarray) -> float:
        n = self.WINDOW_S * SAMPLE_RATE
        audio = np.asarray(audio, dtype=np.float32)[-n:]
        audio = np.pad(audio, (n - len(audio), 0))  # [n]: older audio first, zeros before the turn began
        features = self._features(audio, sampling_rate=SAMPLE_RATE, return_tensors="np", do_normalize=True)
        x = np.asarray(features["input_features"], dtype=np.float32)  # [1, 80, 800]
        (prob,) = self._session.run(None, {"input_features": x})
        return float(np.ravel(prob)[0])
