"""The turn-taking core on scripted timelines: VAD frames, check results and reply events in, actions out.
No audio, no asyncio, no clock: audio time is the frame count."""
from __future__ import annotations

import pytest

from voice.turn_policy import TEXT_EVEN_ODDS, TurnPolicy
from voice.turntaking import (
    CheckTurn,
    Correct,
    DropAhead,
    DropTurn,
    EndTurn,
    Interrupt,
    OpenTurn,
    Reply,
    StartAhead,
    TurnTaking,
)

FRAME_MS = 20.0


class Script:
    """Frames of speech (1.0) and silence (0.0) at 20 ms; `actions` is everything the core asked for, each with
    the audio time (end of the frame) at which it asked."""

    def __init__(self, **policy: object) -> None:
        self.core = TurnTaking(TurnPolicy(**policy))  # type: ignore[arg-type]
        self.core.listen(FRAME_MS)
        self.t_ms = 0.0
        self.actions: list[tuple[float, object]] = []

    def speak(self, ms: float) -> "Script":
        return self._frames(1.0, ms)

    def silent(self, ms: float) -> "Script":
        return self._frames(0.0, ms)

    def _frames(self, prob: float, ms: float, stop: type | None = None) -> "Script":
        for _ in range(int(round(ms / FRAME_MS))):
            got = self.core.frame(prob, self.t_ms)
            self.t_ms += FRAME_MS
            self.actions += [(self.t_ms, a) for a in got]
        return self

    def silent_until(self, kind: type, limit_ms: float = 5000.0) -> object:
        """Silence until the core asks for an action of `kind`; returns it."""
        for _ in range(int(limit_ms / FRAME_MS)):
            n = len(self.actions)
            self.silent(FRAME_MS)
            found = [a for _, a in self.actions[n:] if isinstance(a, kind)]
            if found:
                return found[0]
        raise AssertionError(f"no {kind.__name__} within {limit_ms} ms of silence")

    def send(self, got: list) -> list:
        self.actions += [(self.t_ms, a) for a in got]
        return got

    def of(self, kind: type) -> list:
        return [a for _, a in self.actions if isinstance(a, kind)]

    def at(self, action: object) -> float:
        return next(t for t, a in self.actions if a is action)


def test_fixed_detection_ends_a_turn_after_the_hangover_with_ahead_work_at_the_pause() -> None:
    s = Script(detection="fixed", hangover_ms=500, ahead_silence_ms=96)
    s.silent(200).speak(600)
    end = s.silent_until(EndTurn)
    opened, ahead = s.of(OpenTurn)[0], s.of(StartAhead)[0]
    assert opened == OpenTurn(1, 200.0, during_reply=False) and s.at(opened) == 320.0  # 120 ms of voice qualifies
    assert ahead == StartAhead(1) and s.at(ahead) == 900.0  # 100 ms into the silence: the ahead_silence_ms (96) is past
    assert end == EndTurn(1, 800.0, "silence", (), None) and s.at(end) == 1300.0
    assert s.of(CheckTurn) == [] and s.core.state == "idle"


def test_a_check_that_says_complete_ends_the_turn_at_once() -> None:
    s = Script(detection="text", turn_check_ms=200)
    s.speak(800)
    check = s.silent_until(CheckTurn)
    assert check == CheckTurn(1, 1, silence_ms=200.0) and s.at(check) == 1000.0
    s.silent(60)  # the check takes three frames
    got = s.send(s.core.check_done(1, 1, None, 0.4, cost_ms=55.0))
    (end,) = got
    assert isinstance(end, EndTurn) and end.reason == "complete" and end.speech_end_ms == 800.0
    (rec,) = end.checks
    assert rec.decision == "end" and rec.silence_ms == 260.0 and rec.text_prob == 0.4 and rec.audio_prob is None
    assert rec.complete_prob == pytest.approx(0.4 / (0.4 + TEXT_EVEN_ODDS)) and rec.wait_ms == 200.0


def test_an_unsure_check_waits_for_the_longest_hangover_and_speech_resuming_keeps_one_turn() -> None:
    s = Script(detection="text", max_hangover_ms=2000)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    assert s.send(s.core.check_done(1, check.check, None, 1e-4, 30.0)) == []  # "Can you tell me the capital of"
    s.silent(500)
    s.speak(400)  # "... Australia?"
    assert s.of(DropAhead) == [DropAhead(1)] and len(s.of(StartAhead)) == 1
    second = s.silent_until(CheckTurn)
    assert second.check == 2 and len(s.of(StartAhead)) == 2
    (end,) = s.send(s.core.check_done(1, 2, None, 0.9, 30.0))
    assert end.turn_id == 1 and [c.decision for c in end.checks] == ["wait", "end"]
    assert len(s.of(OpenTurn)) == 1


def test_without_a_check_result_the_turn_ends_at_max_hangover_and_says_the_check_was_unanswered() -> None:
    s = Script(detection="combined", max_hangover_ms=1500, turn_check_ms=160)
    s.speak(500)
    check = s.silent_until(CheckTurn)
    assert s.at(check) == 660.0  # 160 ms into the silence
    end = s.silent_until(EndTurn)
    assert end.reason == "max_hangover" and s.at(end) - 500.0 == 1500.0
    (rec,) = end.checks  # the trace tells a check too slow for the hold from no check at all
    assert rec.decision == "unanswered" and rec.silence_ms == 1500.0 and rec.cost_ms == 1340.0
    assert rec.complete_prob is None and rec.wait_ms is None
    assert s.send(s.core.check_done(1, check.check, 0.9, 0.5, 1400.0)) == []  # its late result changes nothing


def test_a_check_answered_before_the_hold_is_not_unanswered() -> None:
    s = Script(detection="combined", max_hangover_ms=1000)
    s.speak(500)
    check = s.silent_until(CheckTurn)
    assert s.send(s.core.check_done(1, check.check, 0.01, 1e-4, 40.0)) == []  # unsure: wait the longest hold
    end = s.silent_until(EndTurn)
    assert end.reason == "max_hangover" and [c.decision for c in end.checks] == ["wait"]


def test_a_middling_probability_waits_a_scaled_silence() -> None:
    policy = TurnPolicy(detection="text", sure_prob=0.6, unsure_prob=0.2, turn_check_ms=200, max_hangover_ms=2000)
    assert policy.wait_ms(0.6) == 200.0 and policy.wait_ms(0.2) == 2000.0 and policy.wait_ms(None) == 2000.0
    mid = policy.wait_ms(0.4)
    assert 200.0 < mid < 2000.0 and policy.wait_ms(0.3) > mid > policy.wait_ms(0.5)
    s = Script(detection="text", sure_prob=0.6, unsure_prob=0.2, turn_check_ms=200, max_hangover_ms=2000)
    s.speak(500)
    check = s.silent_until(CheckTurn)
    text_prob = 0.4 * TEXT_EVEN_ODDS / 0.6  # complete_prob 0.4
    assert s.send(s.core.check_done(1, check.check, None, text_prob, 10.0)) == []
    end = s.silent_until(EndTurn)
    assert end.reason == "complete" and end.checks[0].wait_ms == pytest.approx(mid)
    assert s.at(end) - 500.0 == pytest.approx(mid, abs=FRAME_MS)


def test_a_result_for_a_pause_that_ended_is_stale() -> None:
    s = Script(detection="smart_turn")
    s.speak(500)
    check = s.silent_until(CheckTurn)
    s.speak(300)
    assert s.send(s.core.check_done(1, check.check, 0.99, None, 20.0)) == []  # would have said complete
    s.silent_until(CheckTurn)
    end = s.silent_until(EndTurn)  # the second pause's check never answers
    assert end.reason == "max_hangover" and [c.decision for c in end.checks] == ["stale", "unanswered"]


def test_combined_weighs_the_audio_model_less_than_the_text() -> None:
    policy = TurnPolicy(detection="combined", audio_weight=0.25)
    sure_audio_half_sentence = policy.complete_prob(audio_prob=0.98, text_prob=1e-4)
    unsure_audio_whole_request = policy.complete_prob(audio_prob=0.2, text_prob=0.5)
    assert sure_audio_half_sentence < 0.1 and unsure_audio_whole_request > 0.9
    assert policy.complete_prob(None, None) is None and policy.complete_prob(0.9, None) > 0.5
    # a transcript not heard yet gives no text signal: the audio model alone cannot end the turn at once
    assert policy.complete_prob(0.9, None) < policy.sure_prob
    # an LLM that never gives one (a remote LLM): the audio model decides alone, as smart_turn
    assert policy.without_text().detection == "smart_turn" and policy.without_text().complete_prob(0.9, None) == pytest.approx(0.9)
    assert TurnPolicy(detection="text").without_text().detection == "fixed"
    assert TurnPolicy(detection="smart_turn").complete_prob(0.8, 1e-9) == pytest.approx(0.8)
    assert TurnPolicy(detection="text").complete_prob(0.01, 0.3) == pytest.approx(0.3 / (0.3 + TEXT_EVEN_ODDS))

def test_the_audio_model_is_needed_only_where_its_score_could_change_the_wait() -> None:
    from voice.turn_policy import AUDIO_RANGE

    policy = TurnPolicy(detection="combined")
    for text_prob in (1e-4, 0.01, 0.05, 0.2, 0.3, 0.45, 0.9):
        waits = {policy.wait_ms(policy.complete_prob(a, text_prob)) for a in (*AUDIO_RANGE, 0.3, 0.7)}
        assert policy.audio_can_change(text_prob) == (len(waits) > 1), text_prob
    assert policy.audio_can_change(0.9) is False and policy.audio_can_change(0.05) is True  # sure; in between
    assert policy.audio_can_change(1e-4) is False  # a half sentence waits the longest hold whatever the audio says
    assert policy.audio_can_change(None) is True  # no text yet: the audio is all there is
    assert TurnPolicy(detection="smart_turn").audio_can_change(0.99) is True
    assert TurnPolicy(detection="text").audio_can_change(0.05) is False



def test_barge_in_needs_the_minimum_speech_and_a_backchannel_is_dropped() -> None:
    s = Script(detection="text", interrupt_by="duration", barge_in_min_speech_ms=200)
    s.send(s.core.typed("tell me a story"))
    assert s.core.state == "responding"
    s.speak(160).silent(300)  # "uh-huh"
    opened = s.of(OpenTurn)[0]
    assert opened.during_reply and s.of(DropTurn) == [DropTurn(opened.turn_id, 160.0)]
    assert s.of(Interrupt) == [] and s.of(StartAhead) == [] and s.of(CheckTurn) == []
    s.speak(400)
    (barge,) = s.of(Interrupt)
    assert barge == Interrupt(1, t_ms=660.0, reason="barge_in")  # 200 ms after the speech began at 460 ms
    s.send(s.core.reply_ended(1, interrupted=True))
    check = s.silent_until(CheckTurn)  # the interrupting speech is a turn of its own
    (end,) = s.send(s.core.check_done(check.turn_id, check.check, None, 0.5, 10.0))
    assert s.send(s.core.heard(end.turn_id, "what about dragons")) == [Reply(end.turn_id, "what about dragons", "voice")]


def test_speech_soon_after_an_endpoint_joins_that_request_and_stops_its_reply() -> None:
    s = Script(detection="text", interrupt_by="duration", rejoin_window_ms=1000)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    (end,) = s.send(s.core.check_done(1, check.check, None, 0.3, 10.0))  # "I would like to book a table."
    assert s.send(s.core.heard(1, "I would like to book a table.")) == [Reply(1, "I would like to book a table.", "voice")]
    s.silent(400)
    s.speak(300)  # "... for four people"
    interrupt, opened = s.of(Interrupt)[0], s.of(OpenTurn)[1]
    assert interrupt == Interrupt(1, s.at(interrupt), "rejoin") and opened.joins == 1 and not opened.during_reply
    s.send(s.core.reply_ended(1, interrupted=True))
    check = s.silent_until(CheckTurn)
    (end2,) = s.send(s.core.check_done(opened.turn_id, check.check, None, 0.6, 10.0))
    assert end2.joins == 1
    assert s.send(s.core.heard(2, "I would like to book a table for four people.")) == [
        Reply(2, "I would like to book a table for four people.", "voice")
    ]  # no Interrupt: the early reply is already over


def test_a_continuation_before_the_transcript_arrives_abandons_the_early_answer() -> None:
    s = Script(detection="text", interrupt_by="duration")
    s.speak(600)
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
    s.silent(300).speak(300)
    assert s.of(OpenTurn)[1].joins == 1 and s.of(Interrupt) == []  # no reply had started
    assert s.core.heard(1, "I would like") == []  # the early turn's transcript comes late: ignored


def test_speech_after_the_rejoin_window_or_after_the_reply_ended_is_a_new_request() -> None:
    s = Script(detection="fixed", hangover_ms=500, rejoin_window_ms=1000)
    s.speak(600)
    s.silent_until(EndTurn)
    s.send(s.core.heard(1, "hello"))
    s.silent(1100).speak(400)  # the first voiced sample 1100 ms after the endpoint
    opened = s.of(OpenTurn)[1]
    assert opened.joins is None and opened.during_reply  # under the running reply: a barge-in candidate
    s2 = Script(detection="fixed", hangover_ms=500)
    s2.speak(600)
    s2.silent_until(EndTurn)
    s2.send(s2.core.heard(1, "hello"))
    s2.send(s2.core.reply_ended(1, interrupted=False))
    s2.silent(100).speak(400)
    assert s2.of(OpenTurn)[1] == OpenTurn(2, s2.of(OpenTurn)[1].start_ms, during_reply=False, joins=None)
    s3 = Script(detection="fixed", rejoin_window_ms=0)  # the safety net switched off
    s3.speak(600)
    s3.silent_until(EndTurn)
    s3.send(s3.core.heard(1, "hello"))
    s3.silent(100).speak(400)
    assert s3.of(OpenTurn)[1].joins is None


def test_one_reply_at_a_time_and_late_marks_correct_the_last_interrupted_reply_only() -> None:
    core = TurnTaking(TurnPolicy())
    first = core.typed("one")
    assert first == [Reply(1, "one", "text")]
    second = core.typed("two")
    assert second == [Interrupt(1, None, "replaced"), Reply(2, "two", "text")]
    core.reply_ended(1, interrupted=True)
    assert core.state == "responding"  # the second reply runs
    assert core.played(1, 300.0) == [Correct(1, 300.0)] and core.played(2, 100.0) == []
    assert core.cancel() == [Interrupt(2, None, "cancel")]
    core.reply_ended(2, interrupted=True)
    assert core.played(1, 400.0) == [] and core.played(2, 150.0) == [Correct(2, 150.0)]
    assert core.cancel() == [] and core.state == "idle"
    assert core.greet() == [Reply(3, None, "greeting")]


def test_an_empty_transcript_makes_no_reply_and_bad_policies_are_refused() -> None:
    s = Script(detection="fixed")
    s.speak(400)
    end = s.silent_until(EndTurn)
    assert s.core.heard(end.turn_id, "  ") == [] and s.core.state == "idle"
    with pytest.raises(ValueError, match="turn detection"):
        TurnPolicy(detection="psychic")
    with pytest.raises(ValueError, match="unsure_prob"):
        TurnPolicy(sure_prob=0.2, unsure_prob=0.5)
    with pytest.raises(RuntimeError, match="listen"):
        TurnTaking(TurnPolicy()).frame(1.0, 0.0)


def test_a_turn_that_goes_on_and_on_ends_at_its_maximum_length() -> None:
    s = Script(detection="fixed", max_turn_ms=3000)
    s.speak(5000)
    (end,) = s.of(EndTurn)
    assert end.reason == "max_length" and s.at(end) == 3000.0  # the speech began at 0
    s2 = Script(detection="fixed", max_turn_ms=3000, interrupt_by="duration")
    s2.send(s2.core.typed("tell me a story"))
    s2.speak(5000)  # under a reply it barges in after 200 ms and is a turn like any other, cut at its maximum too
    assert [e.reason for e in s2.of(EndTurn)] == ["max_length"]
