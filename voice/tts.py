"""Speech synthesis: a `Tts` protocol and its backends — Piper (embedded voice, streamed per sentence
in short chunks), flite / espeak-ng via subprocess (light fallback), Coqui (optional, lazy).

It knows text in, float32 audio out; it does not know phrases, turns or sockets.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from voice.audio import pcm16_to_float, resample


class Tts(Protocol):
    sample_rate: int

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        """Yield float32 mono chunks at `sample_rate`. A generator: run it in a worker thread and
        `close()` it to stop mid-phrase; `rate` > 1 speaks faster."""
        ...


def _check_rate(rate: float) -> None:
    if not 0.25 <= rate <= 4.0:
        raise ValueError(f"speaking rate {rate} is outside 0.25..4.0")


def _slices(audio: np.ndarray, chunk_samples: int) -> Iterator[np.ndarray]:
    # short slices so a cancelled reply stops within one slice, not one sentence
    for i in range(0, len(audio), chunk_samples):
        yield audio[i : i + chunk_samples]


class PiperTts:
    """Piper VITS voice (ONNX). Piper renders a sentence at a time; each sentence is yielded in
    `chunk_ms` slices as soon as it is rendered, so first audio arrives after the first sentence.
    `rate` maps to Piper's length_scale = voice default / rate (the joe voice's default is 1.0).
    `voice` is ignored: one PiperTts is one voice. `threads`: onnxruntime's intra-op threads (0: its default,
    every core).
    """

    def __init__(self, model_path: str | Path, *, chunk_ms: int = 200, use_cuda: bool = False, threads: int = 0) -> None:
        from piper import PiperVoice  # lazy: loads onnxruntime and espeak-ng data

        self._voice: Any
        if threads and not use_cuda:  # our own session options: one ONNX session built, not Piper's default and then ours
            import json

            import onnxruntime
            from piper.config import PiperConfig

            opts = onnxruntime.SessionOptions()
            opts.intra_op_num_threads = threads
            # threads that spin between runs take the cores recognition and the engine need under load
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            config = PiperConfig.from_dict(json.loads(Path(f"{model_path}.json").read_text(encoding="utf-8")))
            session = onnxruntime.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
            self._voice = PiperVoice(session=session, config=config)
        else:
            self._voice = PiperVoice.load(str(model_path), use_cuda=use_cuda)
        self.sample_rate = int(self._voice.config.sample_rate)
        self._chunk_samples = self.sample_rate * chunk_ms // 1000
        self._base_length_scale = float(self._voice.config.length_scale)

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        from piper import SynthesisConfig

        _check_rate(rate)
        config = SynthesisConfig(length_scale=self._base_length_scale / rate)
        for sentence in self._voice.synthesize(text, config):  # one AudioChunk per sentence
            yield from _slices(np.asarray(sentence.audio_float_array, dtype=np.float32), self._chunk_samples)


class CommandTts:
    """flite or espeak-ng through a subprocess writing WAV to stdout; light and robotic, no Python deps.

    Output is resampled to `sample_rate` (default: the engine's own rate, 16 kHz for flite's 16 kHz
    voices and 8 kHz for `kal`, 22.05 kHz for espeak-ng). `rate` maps to words per minute (espeak-ng
    `-s`) or duration stretch (flite `--setf duration_stretch`).
    """

    _NATIVE_RATE = {"espeak-ng": 22050, "kal": 8000}

    def __init__(
        self,
        kind: Literal["flite", "espeak-ng"] = "flite",
        voice: str | None = None,
        *,
        sample_rate: int | None = None,
        chunk_ms: int = 200,
    ) -> None:
        if kind not in ("flite", "espeak-ng"):
            raise ValueError(f"unknown command TTS {kind!r}: use 'flite' or 'espeak-ng'")
        if shutil.which(kind) is None:
            raise RuntimeError(f"{kind} is not installed; on Debian: apt-get install -y {kind}")
        self.kind = kind
        self.voice = voice or ("slt" if kind == "flite" else "en-us")
        native = self._NATIVE_RATE.get(kind, self._NATIVE_RATE.get(self.voice, 16000))
        self.sample_rate = sample_rate or native
        self._chunk_ms = chunk_ms

    def _argv(self, text: str, rate: float, voice: str) -> list[str]:
        if self.kind == "flite":
            return ["flite", "-voice", voice, "--setf", f"duration_stretch={1.0 / rate:.3f}", "-t", text, "-o", "/dev/stdout"]
        return ["espeak-ng", "-v", voice, "-s", str(round(175 * rate)), "--stdout", text]

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        _check_rate(rate)
        if not text.strip():
            return
        wav = subprocess.run(self._argv(text, rate, voice or self.voice), check=True, capture_output=True).stdout
        audio, native = _parse_wav(wav)
        audio = resample(audio, native, self.sample_rate)
        yield from _slices(audio, self.sample_rate * self._chunk_ms // 1000)


def _parse_wav(wav: bytes) -> tuple[np.ndarray, int]:
    """PCM16 mono WAV bytes -> (float32 [N], rate). Streams to stdout leave the RIFF sizes unset, so
    chunks are walked by hand and a data chunk of unknown size runs to the end."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise RuntimeError("TTS command did not produce a WAV stream")
    pos, rate = 12, 0
    while pos + 8 <= len(wav):
        cid, size = wav[pos : pos + 4], int.from_bytes(wav[pos + 4 : pos + 8], "little")
        body = pos + 8
        if cid == b"fmt ":
            channels = int.from_bytes(wav[body + 2 : body + 4], "little")
            rate = int.from_bytes(wav[body + 4 : body + 8], "little")
            bits = int.from_bytes(wav[body + 14 : body + 16], "little")
            if channels != 1 or bits != 16:
                raise RuntimeError(f"expected 16-bit mono WAV, got {channels} channels, {bits} bits")
        elif cid == b"data":
            end = len(wav) if size in (0, 0xFFFFFFFF) or body + size > len(wav) else body + size
            data = wav[body:end]
            return pcm16_to_float(data[: len(data) - len(data) % 2]), rate
        pos = body + size + (size & 1)
    raise RuntimeError("WAV stream has no data chunk")


class CoquiTts:
    """Coqui TTS (GPU installs). The package is optional: constructing this without it raises a clear error."""

    def __init__(self, model_name: str, *, device: str = "cpu") -> None:
        try:
            from TTS.api import TTS  # lazy and optional: absent from the default install
        except ImportError as exc:
            raise RuntimeError(
                "Coqui TTS is not installed (or does not import with this torch); run: pip install parley[coqui]"
            ) from exc
        self._tts: Any = TTS(model_name).to(device)
        self.sample_rate = int(self._tts.synthesizer.output_sample_rate)

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        _check_rate(rate)
        audio = np.asarray(self._tts.tts(text=text, speaker=voice, speed=rate), dtype=np.float32)
        yield from _slices(audio, self.sample_rate // 5)
