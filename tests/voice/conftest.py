"""Shared fixtures for the voice tests: real embedded models and the spoken corpus, built once per session."""
from __future__ import annotations

import numpy as np
import pytest

from bench import corpus
from parley.locate import find_embedded


@pytest.fixture(scope="session")
def tiny_transcriber():
    from parley.thread_budget import ThreadBudget, available_cores
    from voice.asr import WhisperTranscriber

    return WhisperTranscriber(find_embedded("asr"), cpu_threads=ThreadBudget.for_cores(available_cores()).asr)  # the server's


@pytest.fixture(scope="session")
def piper_tts():
    from voice.tts import PiperTts

    return PiperTts(find_embedded("tts"))


@pytest.fixture(scope="session")
def silero_path():
    return find_embedded("vad")


@pytest.fixture(scope="session")
def corpus_piper() -> list[np.ndarray]:
    """Every request spoken by Piper, 16 kHz float32."""
    return [corpus.to_16k(*corpus.speak_piper(text)) for text in corpus.REQUESTS]


@pytest.fixture(scope="session")
def corpus_piper_fixed() -> list[np.ndarray]:
    """The corpus spoken by Piper without its prosody noise: the same audio on every run, for timing bounds."""
    return [corpus.to_16k(*corpus.speak_piper(text, deterministic=True)) for text in corpus.REQUESTS]


@pytest.fixture(scope="session")
def corpus_flite() -> list[np.ndarray]:
    """Every request spoken by flite (slt voice), 16 kHz float32."""
    return [corpus.to_16k(*corpus.speak_flite(text)) for text in corpus.REQUESTS]


@pytest.fixture(scope="session")
def tiny_hypotheses(tiny_transcriber, corpus_piper, corpus_flite) -> dict[str, list[str]]:
    """tiny.en's transcript of every corpus clip, per voice (decoded once, used by several tests)."""
    return {
        "piper": [tiny_transcriber.transcribe(a).text for a in corpus_piper],
        "flite": [tiny_transcriber.transcribe(a).text for a in corpus_flite],
    }
