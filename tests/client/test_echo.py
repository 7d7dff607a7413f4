"""Echo handling: the half-duplex guard's hold/release rule, and WebRTC AEC3's echo reduction."""
from __future__ import annotations

import numpy as np
import pytest

from support.sounds import speechlike
from desktop.echo import HalfDuplexGuard, NoEcho, WebRtcAec, level_dbfs, make_echo_control

BLOCK = 320  # 20 ms at 16 kHz


def blocks(x: np.ndarray) -> list[np.ndarray]:
    return [x[i:i + BLOCK] for i in range(0, len(x) - BLOCK + 1, BLOCK)]


def run_guard(guard: HalfDuplexGuard, far: np.ndarray, near: np.ndarray, speaking: bool = True) -> tuple[list, list]:
    sent, barges = [], []
    for f, n in zip(blocks(far), blocks(near)):
        guard.render(f)
        cap = guard.capture(n, speaking)
        sent.append(cap.audio)
        barges.append(cap.barge_in)
    return sent, barges


def echo_of(far: np.ndarray, gain: float, delay: int = 960) -> np.ndarray:
    return np.concatenate([np.zeros(delay, np.float32), far[:-delay] * gain])


def test_level_dbfs() -> None:
    assert level_dbfs(np.zeros(10, np.float32)) == -120.0
    assert level_dbfs(np.full(100, 0.1, np.float32)) == pytest.approx(-20.0, abs=0.01)


def test_guard_holds_back_echo_and_learns_the_coupling() -> None:
    far = speechlike(3.0, level=0.1, seed=2)
    guard = HalfDuplexGuard()
    sent, barges = run_guard(guard, far, echo_of(far, 0.1))  # echo 20 dB below the speaker
    assert not any(barges)
    assert all(not s.any() for s in sent)  # only silence reached the server
    assert -24.0 < guard.coupling_db < -18.0  # -20 dB, against the speaker's peak of the last 200 ms


def test_guard_lets_loud_long_speech_interrupt_with_its_start() -> None:
    far = speechlike(3.0, level=0.1, seed=2)
    user = np.zeros_like(far)
    user[32000:] = speechlike(1.0, level=0.1, seed=3)  # user starts at 2.0 s, 20 dB over the echo
    guard = HalfDuplexGuard()
    sent, barges = run_guard(guard, far, echo_of(far, 0.1) + user)
    first = barges.index(True)
    assert sum(barges) == 1
    assert 2.28 <= first * 0.02 <= 2.4  # after min_speech_ms = 300 ms of loud speech
    assert len(sent[first]) > BLOCK * 10  # held-back audio is released so recognition hears the start
    assert all(len(s) == BLOCK and s.any() for s in sent[first + 1:])  # then the microphone is open


def test_guard_ignores_a_short_loud_noise() -> None:
    far = speechlike(3.0, level=0.1, seed=2)
    cough = np.zeros_like(far)
    cough[32000:32000 + 3200] = speechlike(0.2, level=0.3, seed=4)  # 200 ms
    _, barges = run_guard(HalfDuplexGuard(), far, echo_of(far, 0.1) + cough)
    assert not any(barges)


def test_guard_passes_everything_when_the_assistant_is_quiet() -> None:
    near = speechlike(0.5, seed=5)
    sent, barges = run_guard(HalfDuplexGuard(), np.zeros_like(near), near, speaking=False)
    assert not any(barges)
    assert np.array_equal(np.concatenate(sent), near[:len(sent) * BLOCK])


def test_headphones_mode_passes_through() -> None:
    near = speechlike(0.1)
    cap = NoEcho().capture(near, True)
    assert cap.audio is near and not cap.barge_in
    assert make_echo_control("off").mode == "off"
    assert make_echo_control("guard").mode == "guard"


def test_webrtc_aec_removes_most_echo_and_keeps_the_user() -> None:
    far = speechlike(4.0, level=0.2, seed=6)
    echo = echo_of(far, 0.4, delay=640)
    aec = WebRtcAec()
    out = []
    for f, n in zip(blocks(far), blocks(echo)):
        aec.render(f)
        out.append(aec.capture(n, True).audio)
    cleaned = np.concatenate(out)
    erle_db = level_dbfs(echo[32000:64000]) - level_dbfs(cleaned[32000:64000])
    assert erle_db > 15.0  # measured ~25 dB once converged
    user = speechlike(1.0, level=0.1, seed=7)
    kept = np.concatenate([aec.capture(b, False).audio for b in blocks(user)])  # speaker silent now
    assert abs(level_dbfs(kept[4000:]) - level_dbfs(user[4000:len(kept)])) < 6.0
    assert make_echo_control("auto").mode == "aec"
