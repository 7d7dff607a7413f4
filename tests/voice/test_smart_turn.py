"""Smart Turn v3.2, the embedded audio end-of-turn model, on spoken requests (Piper and flite)."""
from __future__ import annotations

import numpy as np
import pytest

from bench import corpus
from voice.smart_turn import SmartTurn
from parley.locate import find_embedded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn(find_embedded("turn"))


def turn_audio(speech: np.ndarray) -> np.ndarray:
    """What a check sees: a little audio before the speech, the speech, 200 ms of silence after it."""
    return np.concatenate([corpus.silence(200), speech, corpus.silence(200)])


def test_complete_requests_score_complete(model: SmartTurn) -> None:
    piper = [model.complete_prob(turn_audio(corpus._trim(corpus.speak(r, "piper-steady")))) for r in corpus.REQUESTS]
    flite = [model.complete_prob(turn_audio(corpus._trim(corpus.speak(r, "flite")))) for r in corpus.REQUESTS]
    # measured: 20 of 22 for Piper; flite's robotic prosody is far from the model's training speech (15 of 22)
    assert sum(p > 0.5 for p in piper) >= 18, np.round(piper, 2)
    assert sum(p > 0.5 for p in flite) >= 12, np.round(flite, 2)


def test_a_comma_pause_sounds_less_finished_than_a_finished_request(model: SmartTurn) -> None:
    """flite gives a half sentence before a comma its continuation prosody, which the model hears."""
    halves, wholes = [], []
    for first, second in corpus.PAUSED_REQUESTS[:10]:
        audio, pause_at = corpus.speak_paused(first, second, "flite", 300)
        halves.append(model.complete_prob(turn_audio(audio[: int(pause_at * 16)])))
        wholes.append(model.complete_prob(turn_audio(audio)))
    assert np.mean(halves) + 0.2 < np.mean(wholes), (np.round(halves, 2), np.round(wholes, 2))


def test_only_the_last_eight_seconds_count(model: SmartTurn) -> None:
    speech = corpus._trim(corpus.speak(corpus.REQUESTS[0], "piper-steady"))
    short = model.complete_prob(turn_audio(speech))
    long = model.complete_prob(np.concatenate([corpus.white_noise(6000, level=0.2), corpus.silence(8000), turn_audio(speech)]))
    assert long == pytest.approx(short, abs=1e-6)  # the noise ends more than 8 s before the end: unseen


def test_a_file_that_is_not_smart_turn_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="not a Smart Turn"):
        SmartTurn(find_embedded("vad"))  # an ONNX model with other inputs


def test_the_silence_to_come_repeats_the_pauses_quietest_floor() -> None:
    """An audio check made at the pause hears the length a later check would: the pause's quietest 10 ms (room noise,
    never the last word's tail) repeated for the silence still to come."""
    from voice.smart_turn import with_silence_to_come

    rng = np.random.default_rng(0)
    speech = 0.3 * rng.standard_normal(16000).astype(np.float32)
    tail = np.concatenate([0.2 * rng.standard_normal(160), 0.001 * rng.standard_normal(352)]).astype(np.float32)  # 32 ms
    padded = with_silence_to_come(np.concatenate([speech, tail]), silence_ms=32.0, check_ms=160.0)
    extra = padded[16000 + 512 :]
    assert len(extra) == 128 * 16  # 160 - 32 ms
    assert float(np.sqrt(np.mean(np.square(extra)))) < 0.002  # the floor, not the 0.2 word tail
    assert np.array_equal(with_silence_to_come(speech, 32.0, 32.0), speech)  # nothing to come: unchanged
