"""The benchmark prompts: corpus requests in turn by Piper and flite at 16 kHz, WAV files, WER over turns."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import _prompts, corpus
from bench._client import RATE


def test_corpus_prompts_alternate_voices_and_locate_the_end_of_speech() -> None:
    prompts = _prompts.corpus_prompts(3, offset=21)  # wraps past the last request
    assert [p.voice for p in prompts] == ["piper", "flite", "piper"]
    requests = corpus.REQUESTS
    assert [p.text for p in prompts] == [requests[21], requests[0], requests[1]]
    for p in prompts:
        assert p.audio.dtype == np.float32 and p.audio.ndim == 1
        assert 500 < p.speech_end_ms <= p.duration_ms  # speech ends inside the clip, after some words
        tail = p.audio[int(p.speech_end_ms * RATE / 1000) + RATE // 50 :]
        assert tail.size == 0 or float(np.abs(tail).max()) < 0.05  # nothing loud after the located end


def test_a_stereo_44k_wav_becomes_a_16k_mono_prompt(tmp_path: Path) -> None:
    speech = _prompts.spoken("Turn up the volume a little bit.", "flite")
    import soundfile as sf
    import soxr

    stereo = np.stack([soxr.resample(speech.audio, RATE, 44100)] * 2, axis=1)  # [N, 2]
    sf.write(tmp_path / "q.wav", stereo, 44100, subtype="PCM_16")
    prompt = _prompts.from_wav(tmp_path / "q.wav", "turn up the volume a little bit")
    assert prompt.voice == "q.wav" and prompt.text.startswith("turn up")
    assert prompt.duration_ms == pytest.approx(speech.duration_ms, abs=5)
    assert prompt.speech_end_ms == pytest.approx(speech.speech_end_ms, abs=30)


def test_wer_skips_turns_without_a_reference() -> None:
    assert _prompts.wer(["", "set a timer for ten minutes"], ["anything", "set a timer for 10 minutes"]) == 0.0
    assert _prompts.wer(["", ""], ["a", "b"]) is None
    assert _prompts.wer(["tell me a joke"], ["tell me the joke"]) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        _prompts.spoken("hello", "coqui")
