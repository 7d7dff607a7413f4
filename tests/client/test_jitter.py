"""JitterBuffer: prebuffering, order, duplicates, clear() at once, tails, playback accounting."""
from __future__ import annotations

import numpy as np

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
    jb = JitterBuffer(RATE, prebuffer_ms=40)
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
