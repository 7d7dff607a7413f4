"""Noise suppression as a front-end stage (voice.denoise): both backends keep the microphone's clock and say their
delay truly, take noise out and keep a real voice recognisable; music alone opens no turn; a missing package is a
clear error at start."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench import corpus, noise, real_speech
from voice.audio import SAMPLE_RATE
from voice.denoise import Denoiser, DenoiseUnavailable
from voice.frontend import FrontEnd

BACKENDS = ("rnnoise", "deepfilternet")


@pytest.fixture(scope="module")
def prompt() -> real_speech.Prompt:
    if not real_speech.available():
        pytest.fail(f"the real-speech corpus is missing: apt-get install {real_speech.PACKAGES}")
    return next(p for p in real_speech.prompts() if p.name == "privacy-prompt")


def _run(audio: np.ndarray, backend: str) -> tuple[np.ndarray, FrontEnd]:
    front = FrontEnd([Denoiser(backend)])  # type: ignore[arg-type]
    return np.concatenate([front.run(audio[i : i + 320], SAMPLE_RATE) for i in range(0, len(audio), 320)]), front


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_suppressor_keeps_the_clock_and_its_declared_delay(backend: str, prompt: real_speech.Prompt) -> None:
    """Output sample k is still microphone time k / 16 kHz (the voice lines up with the input, lag 0), and the audio
    it still holds at the end is within the delay it declares: the trace's denoise_ms is what it costs."""
    audio = np.concatenate([np.zeros(8000, np.float32), prompt.audio, np.zeros(8000, np.float32)])
    out, front = _run(audio, backend)
    n = len(out)
    lags = range(-160, 161)
    scores = [float(np.dot(out[max(0, k) : n + min(0, k)], audio[max(0, -k) : n - max(0, k)])) for k in lags]
    assert lags[int(np.argmax(scores))] == 0
    held_ms = 1000.0 * (len(audio) - n) / SAMPLE_RATE
    assert 0.5 * front.delay_ms <= held_ms <= front.delay_ms
    assert front.stage_delay_ms("denoise") == pytest.approx(front.delay_ms)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_goes_and_a_real_voice_under_music_is_still_recognised(backend: str, prompt: real_speech.Prompt) -> None:
    from parley.locate import find_embedded
    from voice.asr import WhisperTranscriber

    music = real_speech.music(len(prompt.audio) / SAMPLE_RATE + 2)
    alone, _ = _run(music * 0.05, backend)
    assert np.std(alone[4000:]) < 0.5 * np.std(music[4000 : len(alone)] * 0.05)  # music without a voice: mostly gone
    asr = WhisperTranscriber(find_embedded("asr"), cpu_threads=1)
    heard, _ = _run(noise.mix(prompt.audio, music, snr_db=10), backend)
    assert corpus.wer(prompt.text, asr.transcribe(heard).text) <= 0.2


def test_music_alone_opens_no_turn_with_suppression_on() -> None:
    from parley.locate import find_embedded
    from voice.vad import SileroVad

    if not real_speech.available():
        pytest.fail(f"the real-speech corpus is missing: apt-get install {real_speech.PACKAGES}")
    music = real_speech.music(20.0) * 0.1
    heard, _ = _run(music, "rnnoise")
    assert noise.opened_turns(heard, SileroVad(find_embedded("vad")), min_speech_ms=120, hangover_ms=1000) == 0


def test_a_missing_package_fails_the_start_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from parley.config import ConfigError, load_config
    from parley.runtime import denoiser_factory
    from voice import denoise

    cfg = load_config(None, ["audio.denoise=rnnoise"])
    factory = denoiser_factory(cfg)
    assert factory is not None and factory().name == "denoise"
    assert denoiser_factory(load_config()) is None  # off by default
    denoise._rnnoise_lib.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        with pytest.raises(DenoiseUnavailable, match="pip install --no-deps pyrnnoise"):
            Denoiser("rnnoise")
        with pytest.raises(ConfigError, match="pyrnnoise"):
            denoiser_factory(cfg)
    finally:
        monkeypatch.undo()
        denoise._rnnoise_lib.cache_clear()


async def test_a_session_runs_the_suppressor_after_the_echo_and_its_traces_say_its_delay() -> None:
    from fakes import PERSONAS, Harness
    from voice.session import Session

    h = Harness()
    stages = replace(h.stages, make_denoiser=lambda: Denoiser("rnnoise"))
    session = Session("d1", stages, replace(h.settings, server_aec=True), PERSONAS, "assistant")
    names = [s.name for s in session.listener.frontend.stages]
    assert names[-1] == "denoise" and names.index("denoise") > (names.index("echo") if "echo" in names else -1)
    assert session.new_trace(1, "voice").info["denoise_ms"] == pytest.approx(Denoiser("rnnoise").delay_ms, abs=1e-3)
    assert "denoise_ms" not in session.new_trace(2, "text").info
    await session.close()
    h.engine.stop()
