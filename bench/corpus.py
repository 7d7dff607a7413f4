"""The spoken corpus of the benchmarks and the tests: everyday requests voiced by Piper, flite and espeak-ng, plus WER.

For bench/ and tests/ only (imports parley.locate to find the embedded voice); library code never imports it.
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

# Requests people say with one pause in the middle (a breath, a search for the word), at a syntactic break:
# (before the pause, after it). Several first halves could end a request on their own ("Turn off the lights"):
# those are the hard cases for any end-of-turn detector, and real.
PAUSED_REQUESTS: list[tuple[str, str]] = [
    ("I would like to book a table", "for four people at seven."),
    ("How long does it take to boil", "a potato?"),
    ("Can you tell me the capital of", "Australia?"),
    ("Remind me to call my mother", "tomorrow after lunch."),
    ("What is the weather going to be like", "this weekend in Paris?"),
    ("Set an alarm for", "six thirty tomorrow morning."),
    ("Add eggs and butter", "to my shopping list."),
    ("Send a message to my sister", "saying I am on my way."),
    ("Turn off the lights", "in the living room."),
    ("How many minutes should I", "cook the rice for?"),
    ("Tell me a story about", "a dragon and a brave knight."),
    ("What is the best way to", "learn to play the guitar?"),
    ("Play some quiet music", "for studying."),
    ("Can you recommend a movie", "for a family night?"),
    ("I need a recipe for", "a quick vegetable soup."),
    ("How far is it from London", "to Edinburgh by train?"),
    ("Remind me in twenty minutes", "to take the bread out of the oven."),
    ("What time does the sun", "set today?"),
]
PAUSES_MS = (300, 500, 700, 900, 1000)

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

    from parley.locate import find_embedded

    return PiperVoice.load(find_embedded("tts"))


def speak_piper(text: str, *, length_scale: float = 1.0, deterministic: bool = False) -> tuple[np.ndarray, int]:
    """Speak `text` with the embedded Piper voice; returns (float32 [N], 22050).

    Piper samples its prosody from noise generated inside the ONNX graph (not seedable), so each call
    sounds a little different; `deterministic` turns that noise off for tests that need exact timing (and the same
    text is then synthesised once per process).
    """
    if deterministic:
        audio, rate = _piper_steady(text, length_scale)
        return audio.copy(), rate
    return _piper(text, length_scale, deterministic=False)


def _piper(text: str, length_scale: float, *, deterministic: bool) -> tuple[np.ndarray, int]:
    from piper import SynthesisConfig

    voice = _piper_voice()
    syn = SynthesisConfig(length_scale=length_scale)
    if deterministic:
        syn = SynthesisConfig(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0)
    chunks = [c.audio_float_array for c in voice.synthesize(text, syn)]
    return np.concatenate(chunks).astype(np.float32), int(voice.config.sample_rate)


@functools.lru_cache(maxsize=512)
def _piper_steady(text: str, length_scale: float) -> tuple[np.ndarray, int]:  # callers get copies
    return _piper(text, length_scale, deterministic=True)


def _speak_command(argv: list[str]) -> tuple[np.ndarray, int]:
    """A command-line synthesiser (deterministic): each text once per process; callers get copies."""
    audio, rate = _speak_command_cached(tuple(argv))
    return audio.copy(), rate


@functools.lru_cache(maxsize=512)
def _speak_command_cached(argv: tuple[str, ...]) -> tuple[np.ndarray, int]:
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


def speak(text: str, voice: str = "piper") -> np.ndarray:
    """`text` spoken by `voice` (piper | piper-steady (no prosody noise) | flite | flite-kal | espeak), float32
    [N] at 16 kHz."""
    if voice in ("piper", "piper-steady"):
        audio, rate = speak_piper(text, deterministic=voice == "piper-steady")
    elif voice in ("flite", "flite-kal"):
        audio, rate = speak_flite(text, voice="kal" if voice == "flite-kal" else "slt")
    elif voice == "espeak":
        audio, rate = speak_espeak(text)
    else:
        raise ValueError(f"unknown voice {voice!r}")
    return to_16k(audio, rate)


def _gaps_ms(audio: np.ndarray, rate: int, window_ms: float = 10.0, rel_db: float = -40.0) -> list[tuple[float, float]]:
    """Silent stretches inside the speech of a clip: [(start_ms, end_ms)], longest first."""
    win = int(rate * window_ms / 1000)
    n = len(audio) // win
    rms = np.sqrt(np.mean(audio[: n * win].reshape(n, win).astype(np.float64) ** 2, axis=1) + 1e-12)
    voiced = 20 * np.log10(rms / rms.max()) > rel_db
    idx = np.flatnonzero(voiced)
    gaps, i = [], idx[0]
    while i <= idx[-1]:
        if voiced[i]:
            i += 1
            continue
        j = i
        while not voiced[j]:
            j += 1
        gaps.append((i * window_ms, j * window_ms))
        i = j
    return sorted(gaps, key=lambda g: g[0] - g[1])


def _trim(audio: np.ndarray, rate: int = ASR_RATE) -> np.ndarray:
    start_ms, end_ms = speech_bounds_ms(audio, rate, rel_db=-45.0)
    return audio[int(start_ms * rate / 1000) : int(end_ms * rate / 1000)]


def speak_paused(first: str, second: str, voice: str, pause_ms: float, *, style: str = "comma") -> tuple[np.ndarray, float]:
    """One request with a pause of `pause_ms` between `first` and `second`, float32 [N] at 16 kHz (speech from
    the first sample, nothing after the last). -> (audio, audio time where the pause starts).

    style "comma": spoken as one sentence with a comma at the break (the voice's own continuation prosody), then
    the comma's short silence stretched to `pause_ms`. style "split": the halves spoken separately (the first
    one ends as a finished sentence would) and joined by the silence."""
    if style == "split":
        a, b = _trim(speak(first, voice)), _trim(speak(second, voice))
        return np.concatenate([a, silence(pause_ms), b]), 1000.0 * len(a) / ASR_RATE
    if style != "comma":
        raise ValueError(f"unknown style {style!r}")
    text = f"{first}, {second}"
    audio = _trim(speak(text, voice))
    # the comma's silence: of the gaps of 60 ms or more, the one nearest where the text puts the comma
    expected_ms = 1000.0 * len(audio) / ASR_RATE * (len(first) + 1) / len(text)
    gaps = [g for g in _gaps_ms(audio, ASR_RATE) if g[1] - g[0] >= 60.0]
    near = min(gaps, key=lambda g: abs((g[0] + g[1]) / 2 - expected_ms), default=None)
    if near is None or abs((near[0] + near[1]) / 2 - expected_ms) > 0.2 * 1000.0 * len(audio) / ASR_RATE:
        raise ValueError(f"{voice}: no comma pause found in {text!r} (gaps {gaps[:3]}, expected near {expected_ms:.0f} ms)")
    start_ms, end_ms = near
    cut = lambda ms: int(ms * ASR_RATE / 1000)  # noqa: E731
    return np.concatenate([audio[: cut(start_ms)], silence(pause_ms), audio[cut(end_ms) :]]), start_ms


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
