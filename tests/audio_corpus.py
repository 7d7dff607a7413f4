"""Spoken test corpus for every suite: everyday requests voiced by Piper, flite and espeak-ng, plus WER.

Test helper only (imports web.locate to find the embedded voice); library code never imports it.
Every function returns float32 mono in [-1, 1] with its sample rate; `to_16k` brings it to the ASR rate.
"""
from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ASR_RATE = 16000

# Everyday things people ask a voice assistant. Plain words on purpose: the WER bound is about
# the recogniser hearing the voice, not about how it spells numbers or proper names.
REQUESTS: list[str] = [
    "What is the weather like today?",
    "Set a timer for ten minutes.",
    "Remind me to call my mother tomorrow morning.",
    "Play some relaxing music please.",
    "What time is it right now?",
    "Turn off the lights in the kitchen.",
    "How long does it take to boil an egg?",
    "Add milk and bread to my shopping list.",
    "Tell me a joke about cats.",
    "What is the capital of France?",
    "How do I make a cup of green tea?",
    "Wake me up at seven in the morning.",
    "Can you recommend a good book to read?",
    "How far away is the moon?",
    "Read me the latest news headlines.",
    "What should I cook for dinner tonight?",
    "Send a message to my brother saying I will be late.",
    "How many days are there until the weekend?",
    "Is it going to rain this afternoon?",
    "Give me a simple recipe for pancakes.",
    "Turn up the volume a little bit.",
    "What is the best way to learn a new language?",
]

# Replies the assistant might speak, for the TTS -> ASR round trip. Several, because Piper samples
# its prosody afresh each time: one short sentence makes the score swing by a word either way.
REPLIES: list[str] = [
    "Sure. It will be sunny this afternoon with a light breeze, so it is a good day for a walk in the park.",
    "I have set a timer for ten minutes. I will let you know when it is done.",
    "Paris is the capital of France. It is famous for its museums, its food and the river that runs through it.",
    "To make green tea, heat the water until it is hot but not boiling, then let the leaves steep for two minutes.",
    "Your shopping list now has milk, bread and eggs on it. Is there anything else you need?",
]
REPLY = REPLIES[0]


@functools.lru_cache(maxsize=1)
def _piper_voice():  # -> piper.PiperVoice; cached because loading costs ~0.4 s
    from piper import PiperVoice

    from web.locate import find_embedded

    return PiperVoice.load(find_embedded("tts"))


def speak_piper(text: str, *, length_scale: float = 1.0, deterministic: bool = False) -> tuple[np.ndarray, int]:
    """Speak `text` with the embedded Piper voice; returns (float32 [N], 22050).

    Piper samples its prosody from noise generated inside the ONNX graph (not seedable), so each call
    sounds a little different; `deterministic` turns that noise off for tests that need exact timing.
    """
    from piper import SynthesisConfig

    voice = _piper_voice()
    syn = SynthesisConfig(length_scale=length_scale)
    if deterministic:
        syn = SynthesisConfig(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0)
    chunks = [c.audio_float_array for c in voice.synthesize(text, syn)]
    return np.concatenate(chunks).astype(np.float32), int(voice.config.sample_rate)


def _speak_command(argv: list[str]) -> tuple[np.ndarray, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.wav"
        subprocess.run([*argv, str(out)], check=True, capture_output=True)
        audio, rate = sf.read(out, dtype="float32", always_2d=False)
    return np.asarray(audio, dtype=np.float32), int(rate)


def speak_flite(text: str, *, voice: str = "slt") -> tuple[np.ndarray, int]:
    """Speak `text` with Debian's flite (`slt` is 16 kHz, `kal` 8 kHz); returns (float32 [N], rate)."""
    return _speak_command(["flite", "-voice", voice, "-t", text, "-o"])


def speak_espeak(text: str, *, voice: str = "en-us") -> tuple[np.ndarray, int]:
    """Speak `text` with espeak-ng (22.05 kHz); returns (float32 [N], rate)."""
    return _speak_command(["espeak-ng", "-v", voice, text, "-w"])


def to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    """Resample float32 mono to the ASR rate with soxr."""
    if rate == ASR_RATE:
        return audio.astype(np.float32, copy=False)
    return soxr.resample(audio, rate, ASR_RATE).astype(np.float32)


def write_wav(path: str | Path, audio: np.ndarray, rate: int) -> Path:
    """Write float32 mono as 16-bit PCM WAV (what browsers' fake microphone reads)."""
    path = Path(path)
    sf.write(path, np.clip(audio, -1.0, 1.0), rate, subtype="PCM_16")
    return path


def silence(ms: float, rate: int = ASR_RATE) -> np.ndarray:
    return np.zeros(int(round(ms * rate / 1000)), dtype=np.float32)


def white_noise(ms: float, *, level: float = 0.1, rate: int = ASR_RATE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(round(ms * rate / 1000))) * level).astype(np.float32)


def speech_bounds_ms(audio: np.ndarray, rate: int, *, window_ms: float = 10.0, rel_db: float = -35.0) -> tuple[float, float]:
    """(start_ms, end_ms) of the speech inside a TTS clip, by energy in short windows.

    A window counts as speech when its RMS is within `rel_db` of the loudest window; TTS clips
    have digital silence around the speech, so this is the ground truth for VAD timing tests.
    """
    win = max(1, int(rate * window_ms / 1000))
    n = len(audio) // win
    frames = audio[: n * win].reshape(n, win)  # [n, win]
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)
    db = 20 * np.log10(rms / rms.max())
    voiced = np.flatnonzero(db > rel_db)
    if voiced.size == 0:
        raise ValueError("no speech found in clip")
    return float(voiced[0] * window_ms), float((voiced[-1] + 1) * window_ms)


_NUMBERS = {
    "0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six",
    "7": "seven", "8": "eight", "9": "nine", "10": "ten", "11": "eleven", "12": "twelve",
}  # fmt: skip
_SPELLINGS = {"ok": "okay", "mom": "mother", "alright": "all right"}


def normalize_text(text: str) -> str:
    """Lowercase, drop punctuation, spell small numbers: so WER counts words heard, not typography."""
    text = text.lower().replace("’", "'")
    text = re.sub(r"(\d+):00\b", r"\1", text)  # "7:00" said as "seven"
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    words = []
    for word in text.split():
        word = word.strip("'")
        word = _NUMBERS.get(word, word)
        word = _SPELLINGS.get(word, word)
        if word:
            words.extend(word.split())
    return " ".join(words)


def wer(reference: str | list[str], hypothesis: str | list[str]) -> float:
    """Word error rate over one pair or a whole corpus (errors summed, then divided), after normalising."""
    import jiwer

    refs = [reference] if isinstance(reference, str) else list(reference)
    hyps = [hypothesis] if isinstance(hypothesis, str) else list(hypothesis)
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    refs_n = [normalize_text(r) for r in refs]
    hyps_n = [normalize_text(h) for h in hyps]
    # jiwer rejects empty references; every corpus reference has words, an empty hypothesis is all deletions
    return float(jiwer.wer(refs_n, [h if h else "<empty>" for h in hyps_n]))
