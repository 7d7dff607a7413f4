"""voice.echo_presence: the far end's echo is found at its delay, under the user's speech too; speech that is not the
far end's, and a quiet microphone, are no echo."""
from __future__ import annotations

import numpy as np
import pytest

from bench import corpus
from voice.echo_presence import MAX_LAG, WINDOW, EchoPresence, peak_correlation

pytestmark = pytest.mark.slow  # speech from Piper and flite

FAR = "Once upon a time, in a kingdom far away, there lived a brave knight who feared nothing but the dark."


def feed(presence: EchoPresence, mic: np.ndarray, far: np.ndarray) -> None:
    for i in range(0, min(len(mic), len(far)) - 160, 160):
        presence.push(mic[i : i + 160], far[i : i + 160], i / 16.0)


def room(audio: np.ndarray, rt60_s: float) -> np.ndarray:
    """`audio` as a room returns it: the direct path, then reflections dying down 60 dB in rt60_s."""
    t = np.arange(int(0.4 * 16000)) / 16000.0
    ir = np.random.default_rng(0).normal(size=len(t)) * np.exp(-t * 6.9 / rt60_s)
    ir[0] = 3.0
    return np.convolve(audio, ir / np.sqrt(np.sum(ir**2)))[: len(audio)].astype(np.float32)


@pytest.mark.parametrize("delay_ms,rt60_s", [(0, None), (90, None), (300, None), (90, 0.3)])
def test_the_echo_is_found_at_any_delay_under_the_users_voice(delay_ms: float, rt60_s: float | None) -> None:
    far = corpus.speak(FAR, "piper")
    user = corpus.speak("No, tell me about Mars instead, please.", "flite")
    d = int(16 * delay_ms)
    mic = np.zeros_like(far)
    src = far if rt60_s is None else room(far, rt60_s)
    mic[d:] += src[: len(far) - d] * 10 ** (-20 / 20)  # a quiet echo
    mic[:len(user)] += user[: len(mic)] * 0.5  # the user talks over all of the first windows
    p = EchoPresence()
    feed(p, mic, far)
    assert p.correlation is not None and p.present(len(far) / 16.0)
    feed(p, user[: len(far)] * 0.5, far)  # then the user talks alone, louder than the echo ever was: still assumed
    assert p.present(2 * len(far) / 16.0)


def test_other_speech_and_silence_are_no_echo() -> None:
    far = corpus.speak(FAR, "piper")
    p = EchoPresence()
    user = np.concatenate([corpus.speak(t, v) for t, v in [("Yeah.", "piper-steady"), ("Wait, stop.", "flite"),
                                                           ("What is the weather like today?", "espeak"),
                                                           ("Uh-huh, right, okay.", "piper")]])  # fmt: skip
    mic = np.zeros_like(far)
    mic[: len(user)] += user[: len(mic)]
    feed(p, mic, far)
    assert p.correlation is not None and p.correlation < 0.3 and not p.present(len(far) / 16.0)
    q = EchoPresence()
    assert q.present(0.0)  # nothing measured yet: the canceller's output is used
    feed(q, np.zeros_like(far), far)  # the reply plays and the microphone stays silent: it does not hear it
    assert q.correlation == 0.0 and not q.present(len(far) / 16.0)


def test_peak_correlation_lines_the_window_up_with_its_source() -> None:
    rng = np.random.default_rng(0)
    far = rng.normal(size=MAX_LAG + WINDOW).astype(np.float32)
    lag = 1234
    mic = far[MAX_LAG - lag : MAX_LAG - lag + WINDOW] * 0.1
    corr, i = peak_correlation(mic, far)
    assert corr == pytest.approx(1.0, abs=1e-3) and len(far) - WINDOW - i == lag
    assert peak_correlation(rng.normal(size=WINDOW).astype(np.float32), far)[0] < 0.1


def test_a_silent_stretch_of_the_far_end_correlates_with_nothing() -> None:
    """Before a reply starts the far end's history is silence: the FFT's rounding noise over its near-zero norm read
    as correlations of 100 and more there (seen in a server's measurements), at a delay where nothing played."""
    rng = np.random.default_rng(1)
    far = np.zeros(MAX_LAG + WINDOW, np.float32)
    far[MAX_LAG:] = rng.normal(size=WINDOW).astype(np.float32) * 0.1  # the reply starts with the window
    mic = rng.normal(size=WINDOW).astype(np.float32) * 0.01  # the user's room, not the reply
    corr, _ = peak_correlation(mic, far)
    assert 0.0 <= corr < 0.3
