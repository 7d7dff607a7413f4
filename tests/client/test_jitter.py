"""JitterBuffer: prebuffering, order, duplicates, clear() at once, tails, playback accounting, the adaptive
jitter target and the client's own playback start (on a fake clock: times are passed in)."""
from __future__ import annotations

import numpy as np
import pytest

from desktop.jitter import JitterBuffer

RATE = 1000  # 1 sample per ms keeps the arithmetic readable


def ones(n: int, v: float = 1.0) -> np.ndarray:
    return np.full(n, v, np.float32)


def test_waits_for_prebuffer_then_plays_in_order() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=50)
    jb.push(1, 0, ones(30, 0.1))
    assert not jb.pull(10).any()  # 30 ms < 50 ms prebuffer: silence
    jb.push(1, 1, ones(30, 0.2))
    out = jb.pull(60, now_s=5.0)
    assert np.allclose(out[:30], 0.1) and np.allclose(out[30:60], 0.2)
    status = jb.status(1)
    assert status is not None and status.started_at_s == 5.0 and status.played_ms == 60.0 and not status.finished


def test_duplicate_and_old_sequence_numbers_are_dropped() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0)
    assert jb.push(1, 0, ones(10))
    assert not jb.push(1, 0, ones(10))
    assert jb.push(1, 2, ones(10))
    assert not jb.push(1, 1, ones(10))
    assert jb.buffered_ms() == 20.0


def test_clear_drops_buffered_audio_at_once_and_late_chunks() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0)
    jb.push(3, 0, ones(500))
    assert jb.pull(100).sum() == 100
    assert jb.clear(3) == 400
    assert not jb.pull(100).any()  # the very next block is silent
    assert not jb.push(3, 1, ones(100))  # a chunk still in flight is ignored
    assert not jb.playing()
    status = jb.status(3)
    assert status is not None and status.finished and status.played_ms == 100.0


def test_clear_one_turn_keeps_the_next() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0)
    jb.push(1, 0, ones(100, 0.1))
    jb.push(2, 0, ones(100, 0.2))
    jb.clear(1)
    assert np.allclose(jb.pull(100), 0.2)


def test_ended_turn_plays_its_short_tail_and_finishes() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=80)
    jb.push(1, 0, ones(20))
    assert not jb.pull(10).any()
    jb.end_turn(1)
    assert jb.pull(30).sum() == 20
    jb.pull(1)
    status = jb.status(1)
    assert status is not None and status.finished and status.played_ms == 20.0


def test_underrun_rebuffers_before_resuming() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=40, step_ms=0)  # a fixed target
    jb.push(1, 0, ones(40))
    assert jb.pull(50).sum() == 40  # 10 samples short: an underrun
    assert jb.underruns == 1
    jb.push(1, 1, ones(20))
    assert not jb.pull(10).any()  # 20 < 40: waits again rather than clicking
    jb.push(1, 2, ones(20))
    assert jb.pull(40).sum() == 40


def test_start_time_includes_offset_within_block() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0)
    jb.pull(0)
    jb.push(7, 0, ones(10))
    jb.pull(10, now_s=1.0)
    status = jb.status(7)
    assert status is not None and status.started_at_s == 1.0


def test_playback_start_is_arrival_to_first_sample_at_the_speaker() -> None:
    jb = JitterBuffer(RATE)  # default: no prebuffer, the first message plays at the next block
    jb.pull(20, now_s=9.99)  # idle blocks before the reply
    assert jb.push(4, 0, ones(200), arrival_s=10.000)
    jb.push(4, 1, ones(200), arrival_s=10.150)  # a later message does not move the arrival
    jb.pull(20, now_s=10.012)  # the next block reaches the speaker 12 ms after the arrival
    status = jb.status(4)
    assert status is not None and status.arrived_at_s == 10.0 and status.start_ms is not None
    assert abs(status.start_ms - 12.0) < 1e-6 and status.underruns == 0


def test_unplayed_or_unstamped_turn_has_no_start() -> None:
    jb = JitterBuffer(RATE)
    jb.push(1, 0, ones(10))  # no arrival time given
    jb.pull(10, now_s=1.0)
    jb.push(2, 0, ones(10), arrival_s=1.0)
    assert jb.status(1).start_ms is None  # type: ignore[union-attr]
    assert jb.status(2).start_ms is None  # type: ignore[union-attr]  # not played yet


def test_underrun_mid_turn_raises_the_target_and_counts_on_the_turn() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0, step_ms=20, max_prebuffer_ms=200)
    jb.push(1, 0, ones(30))
    assert jb.pull(50).sum() == 30  # ran dry part-way
    assert jb.underruns == 1 and jb.target_ms == 20.0
    assert not jb.pull(10).any() and jb.underruns == 1  # still dry: one underrun, not one per block
    jb.push(1, 1, ones(10))
    assert not jb.pull(10).any()  # 10 < 20 ms target: rebuffers instead of clicking
    jb.push(1, 2, ones(10))
    assert jb.pull(20).sum() == 20
    assert jb.status(1).underruns == 1  # type: ignore[union-attr]


def test_target_is_capped_and_comes_down_after_smooth_turns() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0, step_ms=20, max_prebuffer_ms=40)
    jb.push(1, 0, ones(5))
    for seq in range(1, 5):  # four underruns in one turn
        jb.pull(100)
        jb.push(1, seq, ones(60))
    assert jb.underruns == 4 and jb.target_ms == 40.0  # capped
    jb.end_turn(1)
    jb.pull(1000)
    assert jb.target_ms == 40.0  # a turn with underruns does not lower it
    for turn in (2, 3):
        jb.push(turn, 0, ones(50))
        jb.end_turn(turn)
        assert jb.pull(100).sum() == 50
        jb.pull(1)
    assert jb.target_ms == 0.0  # two smooth turns: back to the floor


def test_waiting_for_the_first_audio_and_a_barge_in_are_no_underruns() -> None:
    jb = JitterBuffer(RATE, prebuffer_ms=0, step_ms=20)
    jb.push(1, 0, ones(0))  # the turn is known, no audio yet
    assert not jb.pull(20).any()
    jb.push(1, 1, ones(100))
    jb.pull(20)
    assert jb.clear(1) == 80 and not jb.pull(20).any()  # the clear still stops it at once
    assert jb.underruns == 0 and jb.target_ms == 0.0


def test_bad_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="jitter target"):
        JitterBuffer(RATE, prebuffer_ms=100, max_prebuffer_ms=50)
