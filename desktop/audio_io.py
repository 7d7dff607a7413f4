"""Audio devices behind one interface: sounddevice streams, and array/file-backed fakes for tests.

Callbacks run on an audio thread and carry float32 mono at the device rate; this module knows
nothing about the server, resampling or the wire.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from desktop.fifo import SampleFifo

# on_input(block float32 [n] at input_rate, capture_time_s on the perf_counter clock of block[0])
InputCallback = Callable[[np.ndarray, float], None]
# fill_output(n) -> float32 [n] at output_rate; called on the audio thread just before playback
OutputCallback = Callable[[int], np.ndarray]


class NoAudioDevice(Exception):
    """No usable input or output device; the message says which and what to try."""


class AudioIO(Protocol):
    input_rate: int
    output_rate: int
    output_latency_s: float  # time from fill_output() returning to the sound leaving the speaker

    def start(self, on_input: InputCallback, fill_output: OutputCallback) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    max_input_channels: int
    max_output_channels: int
    default_sample_rate: float


def list_devices() -> list[DeviceInfo]:
    """Every PortAudio device; an empty list when PortAudio finds none (or is not installed)."""
    try:
        import sounddevice as sd
    except OSError:  # the PortAudio library itself is missing
        return []
    return [
        DeviceInfo(int(d["index"]), str(d["name"]), int(d["max_input_channels"]),
                   int(d["max_output_channels"]), float(d["default_samplerate"]))
        for d in sd.query_devices()
    ]


def _pick(devices: list[DeviceInfo], wanted: str | None, kind: str) -> DeviceInfo:
    key = "max_input_channels" if kind == "input" else "max_output_channels"
    usable = [d for d in devices if getattr(d, key) > 0]
    if not usable:
        raise NoAudioDevice(
            f"no audio {kind} device found. Connect a microphone and speakers (or headphones), "
            "check `parley client --list-devices`, or use the browser client at http://HOST:PORT/."
        )
    if wanted is None:
        import sounddevice as sd

        default = sd.default.device[0 if kind == "input" else 1]
        return next((d for d in usable if d.index == default), usable[0])
    if wanted.isdigit():
        match = [d for d in usable if d.index == int(wanted)]
    else:
        match = [d for d in usable if wanted.lower() in d.name.lower()]
    if not match:
        raise NoAudioDevice(f"no audio {kind} device matches {wanted!r}; see `parley client --list-devices`")
    return match[0]


class SoundDeviceIO:
    """Microphone and speaker through two sounddevice streams, each at its device's own rate."""

    def __init__(self, input_device: str | None = None, output_device: str | None = None, block_ms: int = 20,
                 output_latency: str | float = "low") -> None:
        devices = list_devices()
        self._in = _pick(devices, input_device, "input")
        self._out = _pick(devices, output_device, "output")
        self.input_rate = int(self._in.default_sample_rate)
        self.output_rate = int(self._out.default_sample_rate)
        self.output_latency_s = 0.0
        self._block_ms = block_ms
        self._latency = output_latency  # PortAudio's suggested output latency: "low", "high" or seconds
        self._streams: list[Any] = []

    @property
    def names(self) -> tuple[str, str]:
        return self._in.name, self._out.name

    def start(self, on_input: InputCallback, fill_output: OutputCallback) -> None:
        import sounddevice as sd

        def in_cb(indata: np.ndarray, frames: int, t: Any, status: Any) -> None:
            # indata [frames, 1]; PortAudio's clock differs from perf_counter, so shift by its latency
            on_input(indata[:, 0].copy(), time.perf_counter() - frames / self.input_rate - istream.latency)

        def out_cb(outdata: np.ndarray, frames: int, t: Any, status: Any) -> None:
            outdata[:, 0] = fill_output(frames)

        istream = sd.InputStream(device=self._in.index, channels=1, samplerate=self.input_rate, dtype="float32",
                                 blocksize=self.input_rate * self._block_ms // 1000, callback=in_cb)
        # "low" by default: the device's own buffer is the last prebuffer before the ear (sounddevice's default: "high")
        ostream = sd.OutputStream(device=self._out.index, channels=1, samplerate=self.output_rate, dtype="float32",
                                  blocksize=self.output_rate * self._block_ms // 1000, latency=self._latency,
                                  callback=out_cb)
        self.output_latency_s = float(ostream.latency)
        self._streams = [istream, ostream]
        for s in self._streams:
            s.start()

    def stop(self) -> None:
        for s in self._streams:
            s.stop()
            s.close()
        self._streams = []


class ArrayAudioIO:
    """A fake sound card paced by the wall clock: the microphone plays queued arrays (silence in
    between) and everything the speaker is given is recorded. `echo_gain` > 0 leaks the speaker
    back into the microphone after `echo_delay_ms`, like a laptop without headphones."""

    def __init__(self, input_rate: int = 16000, output_rate: int = 16000, block_ms: int = 20,
                 echo_gain: float = 0.0, echo_delay_ms: int = 60, noise_dbfs: float | None = None) -> None:
        self.input_rate = input_rate
        self.output_rate = output_rate
        self.output_latency_s = 0.0
        self._block_ms = block_ms
        self._echo_gain = echo_gain
        self._mic = SampleFifo()
        self._lock = threading.Lock()
        self._played: list[np.ndarray] = []
        self._played_at: list[float] = []
        delay = int(echo_delay_ms * input_rate / 1000)
        self._echo_line: SampleFifo | None = None
        if echo_gain:
            self._echo_line = SampleFifo()
            self._echo_line.push(np.zeros(delay, np.float32))
        self._noise = 10 ** (noise_dbfs / 20) if noise_dbfs is not None else 0.0
        self._rng = np.random.default_rng(0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.mic_idle = threading.Event()
        self.mic_idle.set()

    def say(self, audio: np.ndarray, rate: int) -> None:
        """Queue speech for the microphone (resampled to the input rate)."""
        import soxr

        pcm = np.asarray(audio, dtype=np.float32)
        if rate != self.input_rate:
            pcm = soxr.resample(pcm, rate, self.input_rate).astype(np.float32)
        self._mic.push(pcm)
        self.mic_idle.clear()

    def played(self) -> np.ndarray:
        """Everything written to the speaker so far, float32 [N] at output_rate."""
        with self._lock:
            return np.concatenate(self._played) if self._played else np.zeros(0, np.float32)

    def start(self, on_input: InputCallback, fill_output: OutputCallback) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(on_input, fill_output), daemon=True, name="fake-audio")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None

    def _next_mic(self, n: int) -> np.ndarray:
        out = self._mic.take(n)
        if not len(self._mic):
            self.mic_idle.set()
        if self._noise:
            out += (self._rng.standard_normal(n) * self._noise).astype(np.float32)
        return out

    def _run(self, on_input: InputCallback, fill_output: OutputCallback) -> None:
        n_in = self.input_rate * self._block_ms // 1000
        n_out = self.output_rate * self._block_ms // 1000
        period = self._block_ms / 1000
        next_t = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            out = np.asarray(fill_output(n_out), dtype=np.float32)
            with self._lock:
                self._played.append(out)
                self._played_at.append(now)
            mic = self._next_mic(n_in)
            if self._echo_line is not None:
                import soxr

                leak = out if self.output_rate == self.input_rate else soxr.resample(out, self.output_rate, self.input_rate)
                self._echo_line.push(leak * self._echo_gain)
                mic += self._echo_line.take(n_in)
            on_input(mic, now)
            next_t += period
            time.sleep(max(0.0, next_t - time.perf_counter()))


def file_audio_io(mic_wav: str | Path, **kwargs: Any) -> ArrayAudioIO:
    """An ArrayAudioIO whose microphone plays a WAV file once; save the speaker with save_played()."""
    import soundfile as sf

    audio, rate = sf.read(str(mic_wav), dtype="float32", always_2d=True)
    io = ArrayAudioIO(**kwargs)
    io.say(audio.mean(axis=1), int(rate))
    return io


def save_played(io: ArrayAudioIO, path: str | Path) -> None:
    import soundfile as sf

    sf.write(str(path), io.played(), io.output_rate)
