from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice.audio import AudioFrame, Framer, float_to_pcm16, pcm16_to_float, resample


def test_pcm16_round_trip_is_exact_to_one_step():
    x = np.linspace(-1, 1, 1001, dtype=np.float32)
    y = pcm16_to_float(float_to_pcm16(x))
    assert y.dtype == np.float32
    assert np.max(np.abs(x - y)) <= 2.0 / 32768  # rounding plus the 32767/32768 scale asymmetry


def test_pcm16_odd_length_is_an_error():
    with pytest.raises(ValueError, match="even"):
        pcm16_to_float(b"\x00\x01\x02")


def test_float_to_pcm16_clips_instead_of_wrapping():
    pcm = np.frombuffer(float_to_pcm16(np.array([2.0, -3.0, 0.5], dtype=np.float32)), dtype="<i2")
    assert pcm.tolist() == [32767, -32767, 16384]


def test_resample_keeps_duration_and_tone():
    t = np.arange(22050) / 22050
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)  # 1 s at 22.05 kHz
    out = resample(tone, 22050, 16000)
    assert out.dtype == np.float32 and abs(len(out) - 16000) <= 1
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16000 / len(out) - 440) < 2
    assert resample(tone, 16000, 16000) is tone or np.array_equal(resample(tone, 16000, 16000), tone)


def test_framer_rejects_fractional_frames():
    with pytest.raises(ValueError):
        Framer(16000, 0.01)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=12))
def test_framer_rechunks_any_input_into_gapless_stamped_frames(sizes):
    framer = Framer(16000, 32)
    total = sum(sizes)
    signal = np.arange(total, dtype=np.float32)
    frames: list[AudioFrame] = []
    pos = 0
    for n in sizes:
        frames += framer.push(signal[pos : pos + n])
        pos += n
    assert len(frames) == total // 512
    for i, frame in enumerate(frames):
        assert len(frame.samples) == 512 and frame.sample_rate == 16000
        assert frame.t_ms == pytest.approx(32.0 * i)
        assert frame.samples[0] == 512 * i  # no sample lost or repeated
    assert framer.t_ms == pytest.approx(32.0 * len(frames))
