"""The audio front end (voice.frontend): every wire rate to 16 kHz as one stream, one clock for the microphone, stages
in order with the time of their own input, heavy stages off the loop, and a bad rate refused without harm."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import soxr

from voice.audio import SAMPLE_RATE
from voice.frontend import FrontEnd


def _tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


class Recorder:
    """A stage that passes audio on, holding the last `hold` samples back, and records what it was given."""

    name = "recorder"

    def __init__(self, hold: int = 0, heavy: bool = False) -> None:
        self.hold, self.heavy = hold, heavy
        self.delay_ms = 1000.0 * hold / SAMPLE_RATE
        self.calls: list[tuple[float, int, int]] = []  # (t_ms, samples, thread)
        self._kept = np.zeros(0, np.float32)

    def process(self, samples: np.ndarray, t_ms: float) -> np.ndarray:
        self.calls.append((t_ms, len(samples), threading.get_ident()))
        buf = np.concatenate([self._kept, samples])
        cut = max(0, len(buf) - self.hold)
        self._kept = buf[cut:]
        return buf[:cut]


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000])
def test_every_wire_rate_becomes_one_16k_stream_with_little_delay(rate: int) -> None:
    """20 ms messages at the wire's rate come out as one stream: the speech band as soxr's best resampling of the whole
    signal has it (within 70 dB), however the messages are cut, and at most ~3.5 ms behind (soxr's HQ stream: 21 ms
    at 48 kHz, 66 at 8 kHz); the clock counts what came."""
    rng = np.random.default_rng(rate)
    top = 0.9 * min(rate, SAMPLE_RATE) / 2
    t = np.arange(rate) / rate
    x = (sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in np.linspace(100, top, 12)) / 12).astype(np.float32)
    heard = []
    for cut in (rate // 50, 777):
        front = FrontEnd()
        out = []
        for i in range(0, len(x), cut):
            assert front.receive(x[i : i + cut], rate) == pytest.approx(1000.0 * i / rate)
            out.append(front.run(x[i : i + cut], rate))
        heard.append(np.concatenate(out))
        assert front.received_ms == pytest.approx(1000.0)
        assert front.heard_ms == pytest.approx(1000.0 * len(heard[-1]) / SAMPLE_RATE)
        assert front.delay_ms == pytest.approx(front.received_ms - front.heard_ms)
        assert front.delay_ms <= 3.5
    np.testing.assert_array_equal(heard[0], heard[1])
    whole = soxr.resample(x, rate, SAMPLE_RATE, quality="VHQ")
    a, b = heard[0][1000:-1000], whole[1000 : len(heard[0]) - 1000]
    assert np.sum((a - b) ** 2) < np.sum(b**2) * 1e-7  # 70 dB


@pytest.mark.parametrize(("rate", "hz"), [(48000, 8800), (44100, 9000), (24000, 10000)])
def test_what_16k_cannot_carry_is_filtered_out_not_folded_in(rate: int, hz: float) -> None:
    t = np.arange(rate) / rate
    front = FrontEnd()
    y = front.run(np.sin(2 * np.pi * hz * t).astype(np.float32), rate)[200:]
    assert 20 * np.log10(np.sqrt(np.mean(y**2)) / np.sqrt(0.5)) < -70.0


def test_each_stage_gets_its_own_inputs_microphone_time_and_the_echo_goes_first() -> None:
    """A stage that holds audio back delays the next stage's audio, not its clock: the next stage's t_ms is what it
    has been given so far, so the chain's output sample k stays microphone time k / 16 kHz."""
    first, second = Recorder(hold=80), Recorder()
    echo = Recorder()
    front = FrontEnd([first, second], echo=echo)  # type: ignore[arg-type,list-item]
    assert front.stages == (echo, first, second)
    x = _tone(SAMPLE_RATE, 0.1)
    for i in range(0, len(x), 320):
        front.run(x[i : i + 320], SAMPLE_RATE)
    assert [t for t, _, _ in echo.calls] == pytest.approx([20.0 * k for k in range(5)])
    assert [t for t, _, _ in second.calls] == pytest.approx([0.0, 15.0, 35.0, 55.0, 75.0])  # 80 samples held once
    assert front.heard_ms == pytest.approx(95.0)
    assert front.delay_ms == pytest.approx(5.0)


def test_a_heavy_stage_runs_off_the_loop_in_order() -> None:
    heavy, light = Recorder(heavy=True), Recorder()
    front = FrontEnd([heavy, light])  # type: ignore[list-item]
    x = _tone(SAMPLE_RATE, 0.2)

    async def feed() -> list[np.ndarray]:
        return [await front.process(x[i : i + 320], SAMPLE_RATE) for i in range(0, len(x), 320)]

    out = asyncio.run(feed())
    np.testing.assert_array_equal(np.concatenate(out), x)
    loop_thread = light.calls[0][2]
    assert all(thread != loop_thread for _, _, thread in heavy.calls)
    assert [t for t, _, _ in heavy.calls] == pytest.approx([20.0 * k for k in range(10)])


@pytest.mark.parametrize("rate", [0, 4000, 96000])
def test_a_rate_no_wire_carries_is_refused_and_the_clock_keeps(rate: int) -> None:
    front = FrontEnd()
    front.receive(np.zeros(160, np.float32), 8000)
    with pytest.raises(ValueError, match="sample rate"):
        front.receive(np.zeros(160, np.float32), rate)
    assert front.received_ms == pytest.approx(20.0)


async def test_a_session_says_bad_audio_for_a_wrong_rate_and_goes_on_hearing() -> None:
    from fakes import Harness
    from voice.session import InputError

    async with Harness() as h:
        with pytest.raises(InputError) as err:
            h.session.push_audio(np.zeros(320, np.float32), 0, rate=2)
        assert err.value.code == "bad_audio"
        h.session.push_audio(np.zeros(160, np.float32), 0, rate=8000)
        assert h.session.listener.frontend.received_ms == pytest.approx(20.0)
