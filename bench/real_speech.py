"""Recordings of a real person and real music, from Debian packages the test setup installs (scripts/setup.sh): the
Asterisk prompts read by Allison Smith (`asterisk-core-sounds-en-wav`, 8 kHz 16-bit, with their transcripts from
`asterisk-core-sounds-en`; CC-BY-SA-3.0) and the music on hold of `asterisk-moh-opsound-wav`.

A prompt is brought to 16 kHz the way the server hears an 8 kHz caller (voice.frontend), so the corpus is a phone
line's band: what these recordings are.
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from voice.audio import SAMPLE_RATE
from voice.frontend import FrontEnd

SOUNDS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
MUSIC = Path("/usr/share/asterisk/moh")
PACKAGES = "asterisk-core-sounds-en-wav asterisk-core-sounds-en asterisk-moh-opsound-wav"


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    audio: np.ndarray  # float32 at 16 kHz

    @property
    def sentences(self) -> int:
        return len(re.findall(r"[.?!](\s|$)", self.text))


def available() -> bool:
    return SOUNDS.is_dir() and TRANSCRIPTS.is_file() and MUSIC.is_dir()


def _need() -> None:
    if not available():
        raise FileNotFoundError(f"the real-speech corpus is not installed: apt-get install {PACKAGES}")


def to_16k(path: Path) -> np.ndarray:
    """A recording as the server hears it at 16 kHz (its length kept: the filter's few ms padded at the end)."""
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    heard = FrontEnd().run(audio.mean(axis=1), int(rate))
    n = round(len(audio) * SAMPLE_RATE / rate)
    return np.concatenate([heard, np.zeros(max(0, n - len(heard)), np.float32)])[:n]


@lru_cache(maxsize=1)
def transcripts() -> dict[str, str]:
    """Prompt name -> what is said, for the prompts that are speech (not "[a tone]") and have a recording."""
    _need()
    out = {}
    for line in gzip.decompress(TRANSCRIPTS.read_bytes()).decode("utf-8", "replace").splitlines():
        name, sep, text = line.partition(": ")
        text = text.strip()
        if not sep or line.startswith(";") or not text or text.startswith("[") or "/" in name:
            continue
        if (SOUNDS / f"{name}.wav").is_file():
            out[name] = text
    return out


def prompts(min_words: int = 4, max_words: int = 30, limit: int | None = None) -> list[Prompt]:
    """Spoken prompts of `min_words`..`max_words` words, in name order (the same every run)."""
    chosen = []
    for name, text in sorted(transcripts().items()):
        if min_words <= len(text.split()) <= max_words:
            chosen.append(Prompt(name, text, to_16k(SOUNDS / f"{name}.wav")))
            if limit is not None and len(chosen) >= limit:
                break
    return chosen


def music(seconds: float, which: int = 0) -> np.ndarray:
    """`seconds` of a music-on-hold recording (the `which`-th, looped if short), at 16 kHz."""
    _need()
    files = sorted(MUSIC.glob("*.wav"))
    audio = to_16k(files[which % len(files)])
    n = int(seconds * SAMPLE_RATE)
    return np.resize(audio, n).astype(np.float32)
