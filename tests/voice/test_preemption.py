"""The preemptive first phrase's core (voice.preemption) following the turn-taking core on scripted timelines:
pause -> the work ahead -> the phrase made and held -> check -> endpoint -> the reply uses it; a resume drops it;
a "not finished" check keeps it; other words, a joined turn, a busy machine. No audio, no asyncio, no clock."""
from __future__ import annotations

from voice.preemption import DropPhrase, Preemption, ShedPhrase, StartPhrase, UsePhrase
from voice.turn_policy import TurnPolicy
from voice.turntaking import CheckTurn, DropAhead, EndTurn, Join, Reply, StartAhead, TurnTaking

FRAME_MS = 20.0


class Script:
    """Turn-taking fed 20 ms frames; everything it asks for also goes through the preemption core, whose answers
    are collected in `pre` (with the audio time they came at)."""

    def __init__(self, enabled: bool = True, **policy: object) -> None:
        self.turns = TurnTaking(TurnPolicy(**policy))  # type: ignore[arg-type]
        self.turns.listen(FRAME_MS)
        self.core = Preemption(enabled)
        self.t_ms = 0.0
        self.actions: list[object] = []
        self.pre: list[tuple[float, object]] = []

    def feed(self, got: list) -> list:
        self.actions += got
        self.pre += [(self.t_ms, a) for a in self.core.follow(got)]
        return got

    def frames(self, prob: float, ms: float) -> "Script":
        for _ in range(int(round(ms / FRAME_MS))):
            self.feed(self.turns.frame(prob, self.t_ms))
            self.t_ms += FRAME_MS
        return self

    def speak(self, ms: float) -> "Script":
        return self.frames(1.0, ms)

    def silent(self, ms: float) -> "Script":
        return self.frames(0.0, ms)

    def silent_until(self, kind: type, limit_ms: float = 3000.0) -> object:
        for _ in range(int(limit_ms / FRAME_MS)):
            n = len(self.actions)
            self.silent(FRAME_MS)
            found = [a for a in self.actions[n:] if isinstance(a, kind)]
            if found:
                return found[0]
        raise AssertionError(f"no {kind.__name__} within {limit_ms} ms")

    def ahead(self, turn_id: int, text: str, busy: str | None = None) -> list:
        """The work ahead of the pause is done (final transcript + prefill)."""
        got = self.core.ahead_ready(turn_id, text, busy)
        self.pre += [(self.t_ms, a) for a in got]
        return got

    def of(self, kind: type) -> list:
        return [a for _, a in self.pre if isinstance(a, kind)]


def test_a_pause_check_endpoint_releases_the_held_phrase_at_once() -> None:
    s = Script(detection="text", turn_check_ms=160, max_hangover_ms=1000)
    s.silent(100).speak(800)
    assert isinstance(s.silent_until(StartAhead), StartAhead)
    assert s.ahead(1, "what time is it") == [StartPhrase(1, "what time is it")]
    s.core.phrase_ready(1)  # decoded to its first phrase and synthesised, while the check runs
    check = s.silent_until(CheckTurn)
    assert isinstance(check, CheckTurn)
    end = s.feed(s.turns.check_done(1, check.check, None, 0.95, 30.0))
    assert [type(a) for a in end] == [EndTurn]
    reply = s.feed(s.turns.heard(1, "what time is it"))
    assert reply == [Reply(1, "what time is it", "voice")]
    assert s.of(UsePhrase) == [UsePhrase(1, "hit")]  # in the same call as the reply it answers: nothing waits
    assert s.of(DropPhrase) == [] and s.core.outcome(1) == "hit" and s.core.held is None


def test_speech_that_comes_back_drops_the_held_phrase() -> None:
    s = Script(detection="text", turn_check_ms=160)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    s.ahead(1, "can you tell me the capital of")
    s.core.phrase_ready(1)
    s.speak(300)  # the request goes on
    assert DropAhead(1) in s.actions
    assert s.of(DropPhrase) == [DropPhrase(1, "resumed")] and s.core.held is None
    # the second pause makes the phrase again for the whole request; it is not ready at the endpoint: a miss
    s.silent_until(StartAhead)
    assert s.ahead(1, "can you tell me the capital of australia") == [StartPhrase(1, "can you tell me the capital of australia")]
    check = s.silent_until(CheckTurn)
    s.feed(s.turns.check_done(1, check.check, None, 0.95, 30.0))
    s.core.phrase_ready(1)  # after the endpoint
    s.feed(s.turns.heard(1, "can you tell me the capital of australia"))
    assert s.of(UsePhrase) == [UsePhrase(1, "miss")]  # the reply still continues it: nothing is computed twice
    assert s.core.outcome(1) == "miss"


def test_a_not_finished_check_keeps_the_held_phrase_and_the_same_words_reuse_it() -> None:
    s = Script(detection="text", turn_check_ms=160, max_hangover_ms=1000)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    s.ahead(1, "so I was thinking")
    s.core.phrase_ready(1)
    check = s.silent_until(CheckTurn)
    assert isinstance(check, CheckTurn)
    assert s.feed(s.turns.check_done(1, check.check, None, 0.01, 30.0)) == []  # unlikely finished: wait longer
    s.silent(200)
    assert s.of(DropPhrase) == [] and s.core.held == 1  # kept while the wait lasts
    assert s.ahead(1, "so I was thinking") == []  # the same words asked again: what is held answers them
    end = s.silent_until(EndTurn)
    assert isinstance(end, EndTurn) and end.checks[0].decision == "wait"
    s.feed(s.turns.heard(1, "so I was thinking"))
    assert s.of(UsePhrase) == [UsePhrase(1, "hit")]


def test_other_words_at_the_endpoint_drop_the_held_phrase() -> None:
    s = Script(detection="fixed", hangover_ms=400)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    s.ahead(1, "what is the weather")
    s.core.phrase_ready(1)
    s.silent_until(EndTurn)
    s.feed(s.turns.heard(1, "what is the weather like"))  # the final recognition heard more
    assert s.of(UsePhrase) == [] and s.of(DropPhrase) == [DropPhrase(1, "words")]
    assert s.core.outcome(1) == "dropped"


def test_a_busy_machine_sheds_the_phrase_and_the_turn_runs_as_before() -> None:
    s = Script(detection="fixed", hangover_ms=400)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    assert s.ahead(1, "hello there", busy="3 engine requests of other sessions") == [
        ShedPhrase(1, "3 engine requests of other sessions")]  # fmt: skip
    assert s.core.held is None
    s.silent_until(EndTurn)
    s.feed(s.turns.heard(1, "hello there"))
    assert s.of(UsePhrase) == [] and s.core.outcome(1) == "shed"


def test_a_continuation_that_joins_drops_the_ended_turns_phrase() -> None:
    s = Script(detection="fixed", hangover_ms=400, rejoin_window_ms=1000, interrupt_by="duration")
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    s.ahead(1, "tell me about")
    s.silent_until(EndTurn)
    s.speak(300)  # before its transcript came back: the new speech continues the request
    assert Join(2, 1) in s.actions
    assert s.of(DropPhrase) == [DropPhrase(1, "joined")] and s.core.held is None


def test_an_ended_turn_with_no_reply_drops_its_phrase_and_a_typed_turn_is_not_counted() -> None:
    s = Script(detection="fixed", hangover_ms=400)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    s.ahead(1, "um")
    s.silent_until(EndTurn)
    assert s.core.no_reply(1) == [DropPhrase(1, "no_reply")]
    s.feed(s.turns.typed("hello"))
    assert s.core.outcome(2) is None  # preemption is for voice turns only


def test_disabled_preemption_asks_for_nothing_and_traces_nothing() -> None:
    s = Script(enabled=False, detection="fixed", hangover_ms=400)
    s.silent(100).speak(600)
    s.silent_until(StartAhead)
    assert s.ahead(1, "hello there") == []
    s.silent_until(EndTurn)
    s.feed(s.turns.heard(1, "hello there"))
    assert s.pre == [] and s.core.outcome(1) is None
