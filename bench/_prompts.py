"""The spoken prompts the benchmarks send: everyday requests voiced by Piper and flite, or WAV files given.

Speaks through bench/corpus.py (the suites' corpus and WER); knows nothing of servers or sockets.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench import corpus
from bench._client import Prompt

VOICES = ("piper", "flite")


def spoken(text: str, voice: str) -> Prompt:
    """`text` spoken by `voice` (piper | flite), at 16 kHz, with the end of its speech located."""
    if voice == "piper":
        audio, rate = corpus.speak_piper(text)
    elif voice == "flite":
        audio, rate = corpus.speak_flite(text)
    else:
        raise ValueError(f"unknown prompt voice {voice!r} (known: {', '.join(VOICES)})")
    audio16 = corpus.to_16k(audio, rate)
    _, end_ms = corpus.speech_bounds_ms(audio16, corpus.ASR_RATE)
    return Prompt(text, voice, audio16, end_ms)


def from_wav(path: str | Path, text: str = "") -> Prompt:
    """A WAV file as a prompt; `text` (the words said, for WER) may be empty."""
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    audio16 = corpus.to_16k(np.asarray(audio.mean(axis=1), dtype=np.float32), int(rate))
    _, end_ms = corpus.speech_bounds_ms(audio16, corpus.ASR_RATE)
    return Prompt(text, Path(path).name, audio16, end_ms)


def corpus_prompts(n: int, voices: Sequence[str] = VOICES, offset: int = 0) -> list[Prompt]:
    """The first `n` corpus requests (from `offset`, wrapping), voices taken in turn."""
    requests = corpus.REQUESTS
    return [spoken(requests[(offset + i) % len(requests)], voices[i % len(voices)]) for i in range(n)]


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Corpus WER over the turns that have a reference text; None when none has."""
    pairs = [(r, h) for r, h in zip(references, hypotheses) if r]
    if not pairs:
        return None
    return corpus.wer([r for r, _ in pairs], [h for _, h in pairs])
