"""Scripted timelines through the pure endpointer: events and their audio-time stamps."""
from __future__ import annotations

import pytest

from voice.vad import Endpointer, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted


def run(ep: Endpointer, probs: list[float], frame_ms: float = 30.0) -> list:
    events = []
    for i, p in enumerate(probs):
        events += ep.push(p, i * frame_ms)
    return events


def test_turn_starts_after_min_speech_and_ends_after_hangover():
    ep = Endpointer(frame_ms=30, threshold=0.5, min_speech_ms=90, hangover_ms=300)
    probs = [0.0] * 5 + [0.9] * 20 + [0.0] * 10 + [0.0] * 5
    events = run(ep, probs)
    # voice from 150 ms to 750 ms; the hangover (10 frames) ends at 1050 ms
    assert events == [SpeechStarted(150.0), SpeechPaused(750.0), SpeechEnded(750.0)]
    assert not ep.in_speech


def test_started_is_emitted_on_the_frame_that_qualifies():
    ep = Endpointer(frame_ms=30, min_speech_ms=90, hangover_ms=300)
    emitted_at = [i for i, p in enumerate([0.0, 0.9, 0.9, 0.9, 0.9]) if ep.push(p, i * 30.0)]
    assert emitted_at == [3]  # third voiced frame completes 90 ms


def test_short_blips_never_start_a_turn():
    ep = Endpointer(frame_ms=30, min_speech_ms=120, hangover_ms=300)
    assert run(ep, [0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.0, 0.0] * 5) == []


def test_speech_inside_the_hangover_resumes_the_same_turn():
    ep = Endpointer(frame_ms=30, min_speech_ms=60, hangover_ms=300)
    probs = [0.9] * 10 + [0.0] * 5 + [0.9] * 10 + [0.0] * 10
    events = run(ep, probs)
    assert events == [
        SpeechStarted(0.0),
        SpeechPaused(300.0),
        SpeechResumed(450.0),
        SpeechPaused(750.0),
        SpeechEnded(750.0),
    ]


def test_hysteresis_keeps_a_wavering_probability_in_speech():
    ep = Endpointer(frame_ms=32, threshold=0.5, neg_threshold=0.3, min_speech_ms=64, hangover_ms=320)
    events = run(ep, [0.9, 0.9, 0.4, 0.35, 0.45, 0.9, 0.1] + [0.0] * 12, frame_ms=32)
    assert events == [SpeechStarted(0.0), SpeechPaused(192.0), SpeechEnded(192.0)]


def test_end_lag_moves_the_end_back_but_not_before_the_start():
    ep = Endpointer(frame_ms=30, min_speech_ms=60, hangover_ms=90, end_lag_ms=60)
    events = run(ep, [0.0, 0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.0])
    assert events[-1] == SpeechEnded(150.0 - 60.0)
    ep = Endpointer(frame_ms=30, min_speech_ms=60, hangover_ms=90, end_lag_ms=500)
    assert run(ep, [0.0, 0.9, 0.9, 0.0, 0.0, 0.0])[-1] == SpeechEnded(30.0)


def test_for_vad_takes_frame_size_and_lag_from_the_backend():
    class FakeVad:
        frame_ms = 32
        sample_rate = 16000
        end_lag_ms = 32.0

    ep = Endpointer.for_vad(FakeVad(), threshold=0.6, min_speech_ms=100, hangover_ms=400)
    assert (ep.frame_ms, ep.threshold, ep.end_lag_ms, ep.hangover_ms) == (32.0, 0.6, 32.0, 400.0)


def test_reset_forgets_a_turn_in_progress():
    ep = Endpointer(frame_ms=30, min_speech_ms=60, hangover_ms=300)
    run(ep, [0.9] * 5)
    assert ep.in_speech
    ep.reset()
    assert not ep.in_speech and ep.push(0.0, 0.0) == []


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError):
        Endpointer(frame_ms=0)
