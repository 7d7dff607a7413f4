"""Interruptions decided by what was said: the interjection classifier on a recogniser's real outputs, and the
turn-taking core on scripted timelines (speech under a reply holds it; its words stop it or resume it)."""
from __future__ import annotations

import pytest

from voice.interjection import Heard, Kind, Lexicon, classify, echo_share, only_thinking, words
from voice.turntaking import CheckTurn, DropTurn, EndTurn, Interrupt, Join, OpenTurn, Recognise, Release, Reply, StartAhead

from test_turntaking import Script

LEX = Lexicon.of()
REPLY = words("Sure. It will be sunny this afternoon with a light breeze, so it is a good day for a walk in the park.")


def kind(text: str, *, final: bool = True, logprob: float = -0.5, recent: list[str] | None = None) -> Kind:
    recent = REPLY if recent is None else recent
    return classify(Heard(text, logprob, 500.0), recent, LEX, final=final).kind


# What the embedded Whisper tiny.en wrote for backchannels, noises and interruptions spoken by Piper, flite and
# espeak-ng (bench/interruptions.py lists the voices), and what it writes for sounds that are not speech.
@pytest.mark.parametrize("text", ["Yeah.", "Yeah", "Right. Right.", "Got it", "I see...", "MMHMM", "Mm mm", "Okay.",
                                  "Uh-uh.", "Sure", "Oh", "mm-hmm", "Uh huh", "Oh, okay.", "Yes, yes."])  # fmt: skip
def test_backchannels_do_not_interrupt(text: str) -> None:
    assert kind(text, recent=[]) == Kind.BACKCHANNEL
    assert kind(text, recent=[], final=False) == Kind.UNSURE  # "yeah, but ..." may still come: wait for the pause


@pytest.mark.parametrize("text", ["", "Bye bye bye", "[Music]", "(coughing)", "♪", "*sigh*", "you", "Thank you for watching."])
def test_sounds_that_are_not_speech_are_no_words(text: str) -> None:
    assert kind(text) == Kind.NONE


@pytest.mark.parametrize("text,said", [("Wait.", "wait"), ("wait", "wait"), ("No.", "no"), ("Nope", "nope"),
                                       ("Hold on.", "hold on"), ("So, hold on.", "hold on"), ("Actually?", "actually"),
                                       ("Yeah, but wait.", "but")])  # fmt: skip
def test_stop_words_interrupt_at_once_even_mid_speech(text: str, said: str) -> None:
    verdict = classify(Heard(text, -0.6, 300.0), REPLY, LEX, final=False)
    assert verdict.kind == Kind.STOP and verdict.interrupts and verdict.why == said


def test_other_words_interrupt_once_there_are_two_or_at_the_pause() -> None:
    assert kind("Tell me about Mars instead.", final=False) == Kind.INTERRUPT
    assert kind("Mars", final=False) == Kind.UNSURE and kind("Mars", logprob=-0.3) == Kind.INTERRUPT
    assert kind("went", logprob=-0.8) == Kind.NONE  # one unsure word at the pause: Whisper on Piper's "uh-huh"
    assert kind("We have them.", logprob=-0.97) == Kind.NONE  # ... and on espeak-ng's "mm-hmm"
    assert kind("N f", logprob=-0.6, final=False) == Kind.UNSURE  # ... and on flite's, mid-way: letters are no words
    assert kind("the last.", logprob=-0.89) == Kind.NONE  # a garbled echo of "... talk about?": no content words
    assert kind("What did you just say?", final=False) == Kind.STOP  # "what" asks at once
    assert kind("Tell me about Mars", logprob=-1.6) == Kind.NONE  # the recogniser is guessing: no evidence of words


def test_the_replies_own_words_are_echo_and_the_users_words_over_them_are_not() -> None:
    assert kind("sunny this afternoon with a light") == Kind.ECHO
    assert kind("it is a good day for a wall") == Kind.ECHO  # misheard here and there, still in the reply's order
    assert echo_share(words("a good day"), REPLY) == 1.0 and echo_share(words("park walk day"), REPLY) == pytest.approx(1 / 3)
    assert kind("Tell me the capital of Peru.") == Kind.INTERRUPT
    assert kind("no", recent=words("no, it will not rain in the park or in the town today")) == Kind.STOP  # said a while ago
    assert kind("What?", recent=words("Pull up a chair. What shall we talk about?")) == Kind.ECHO  # its last words


def test_the_lexicon_is_configurable() -> None:
    lex = Lexicon.of(backchannels=["ja", "genau"], stop_words=["halt", "moment"])
    assert classify(Heard("Genau.", -0.3, 400.0), [], lex, final=True).kind == Kind.BACKCHANNEL
    assert classify(Heard("Moment!", -0.3, 400.0), [], lex, final=False).kind == Kind.STOP
    assert classify(Heard("Yeah.", -0.3, 400.0), [], lex, final=True).kind == Kind.INTERRUPT  # not in this lexicon


# -- the core ------------------------------------------------------------------------------------------------


class Replying(Script):
    """A reply runs (turn 1); every Recognise the core asks for is answered at once with `hearing`, what the
    recogniser makes of the interjection at that moment (a test sets it as the speech goes on)."""

    def __init__(self, typed: bool = True, **policy: object) -> None:
        super().__init__(**{"detection": "text", **policy})
        self.hearing = ""
        self.answering = True  # False: asks are recorded, not answered (an answer that comes late)
        self.asked: list[tuple[float, Recognise]] = []
        if typed:
            self.send(self.core.typed("tell me a story"))

    def _frames(self, prob: float, ms: float, stop: type | None = None) -> "Replying":
        for _ in range(int(round(ms / 20.0))):
            n = len(self.actions)
            super()._frames(prob, 20.0)
            self._answer(n)
        return self

    def send(self, got: list) -> list:
        n = len(self.actions)
        super().send(got)
        self._answer(n)
        return got

    def _answer(self, n: int) -> None:
        while asks := [a for _, a in self.actions[n:] if isinstance(a, Recognise)]:
            n = len(self.actions)
            for ask in asks:
                self.asked.append((self.t_ms, ask))
                if not self.answering:
                    continue
                heard = Heard(self.hearing, -0.5, 400.0)
                self.actions += [(self.t_ms, a) for a in self.core.interjection_heard(ask.turn_id, ask.n, heard, REPLY)]


def test_a_backchannel_holds_the_reply_then_releases_it_and_opens_no_turn() -> None:
    s = Replying()
    s.hearing = "yeah"
    s.speak(300)
    opened = s.of(OpenTurn)[0]
    assert opened == OpenTurn(2, 0.0, during_reply=True, joins=None, holds=1) and s.at(opened) == 120.0
    assert [t for t, _ in s.asked] == [120.0, 220.0]  # as the speech opens, then every 100 ms of it
    assert s.of(Release) == [] and s.of(Interrupt) == []  # a backchannel so far: "yeah, but ..." may follow
    s.silent(200)
    assert [t for t, _ in s.asked][-1] == 320.0  # at the pause's first silent frame: all of it
    assert s.of(Release) == [Release(1, 2, 320.0, "backchannel", "yeah")] and s.of(DropTurn) == [DropTurn(2, 300.0)]
    assert s.of(Interrupt) == [] and s.of(StartAhead) == [] and s.core.state == "responding"


def test_a_stop_word_interrupts_as_soon_as_it_is_heard_and_the_speech_is_a_turn() -> None:
    s = Replying()
    s.speak(200)
    s.hearing = "wait"
    s.speak(200)
    assert s.of(Interrupt) == [Interrupt(1, 220.0, "barge_in")]  # the first recognition after the word was heard
    s.send(s.core.reply_ended(1, interrupted=True))
    s.hearing = "wait stop please"
    s.speak(400)
    asked = len(s.asked)
    assert s.silent_until(StartAhead).turn_id == 2 and len(s.asked) == asked  # a turn now, heard as any other


def test_a_barge_in_of_only_stop_words_waits_the_longest_pause_for_the_rest_of_what_was_meant() -> None:
    s = Replying(max_hangover_ms=1000)
    s.hearing = "no"
    s.speak(300)
    assert len(s.of(Interrupt)) == 1  # "No," stops the reply at once ...
    s.send(s.core.reply_ended(1, interrupted=True))
    check = s.silent_until(CheckTurn)
    assert s.send(s.core.check_done(2, check.check, None, 0.95, 10.0, text="No.")) == []  # ... sure-sounding, yet not ended
    s.silent(300).speak(900)  # "... tell me about Mars instead."
    assert s.of(EndTurn) == [] and len(s.of(OpenTurn)) == 1  # the same turn goes on
    check = s.silent_until(CheckTurn)
    (end,) = s.send(s.core.check_done(2, check.check, None, 0.95, 10.0, text="No, tell me about Mars instead."))
    assert end.turn_id == 2 and [c.wait_ms for c in end.checks] == [1000.0, s.core.policy.wait_ms(0.95)]
    # a bare "Wait, stop." is still a turn: it ends at the longest pause
    s = Replying(max_hangover_ms=1000)
    s.hearing = "wait stop"
    s.speak(400)
    s.send(s.core.reply_ended(1, interrupted=True))
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(2, check.check, None, 0.95, 10.0, text="Wait, stop."))
    end = s.silent_until(EndTurn)
    assert end.turn_id == 2 and s.at(end) - 400.0 == 1000.0


def test_noise_that_goes_on_resumes_the_reply_but_words_that_follow_still_interrupt() -> None:
    s = Replying()
    s.speak(700)  # music: no words
    (release,) = s.of(Release)
    assert release == Release(1, 2, 520.0, "none") and s.of(Interrupt) == []  # 500 ms of it, at the next look
    asked = len(s.asked)
    s.speak(380)
    assert len(s.asked) == asked + 1 and s.asked[-1][0] == 920.0  # released: nobody waits on it, it is looked at every 400 ms, not 100
    s.hearing = "tell me about Mars instead"
    s.speak(400)
    assert len(s.of(Interrupt)) == 1 and s.of(Interrupt)[0].reason == "barge_in"


def test_echo_of_the_reply_resumes_it_and_never_becomes_a_turn() -> None:
    s = Replying()
    s.hearing = "sunny this afternoon with a light breeze"
    s.speak(900)
    s.silent(300)
    assert [r.reason for r in s.of(Release)] == ["echo"] and s.at(s.of(Release)[0]) == 520.0
    assert s.of(Interrupt) == [] and s.of(EndTurn) == [] and len(s.of(DropTurn)) == 1


def test_a_reply_is_held_at_most_so_long_for_words_that_say_nothing_yet() -> None:
    s = Replying(interject_max_hold_ms=1000)
    s.hearing = "Mars"  # one word, mid-speech: unsure
    s.speak(1400)
    (release,) = s.of(Release)
    assert release.reason == "unsure" and s.at(release) == 1000.0 and s.of(Interrupt) == []
    s.silent(200)  # at the pause, the one word is an interruption after all
    assert s.of(Interrupt) == [Interrupt(1, s.of(Interrupt)[0].t_ms, "barge_in")]


def test_a_verdict_asked_in_a_pause_that_ended_is_not_final() -> None:
    s = Replying()
    s.hearing = "yeah"
    s.speak(300)
    s.answering = False
    s.silent(60)
    (_, ask) = s.asked[-1]  # asked at the pause, on all of it; its answer comes after speech came back
    s.speak(100)  # "yeah ... but"
    got = s.core.interjection_heard(ask.turn_id, ask.n, Heard("yeah", -0.5, 300.0), REPLY)
    assert all(isinstance(a, Recognise) for a in got)  # only the next look at it as it grows
    assert s.of(DropTurn) == [] and s.of(Release) == []  # not the whole of it any more: no release, no drop


def test_a_continuation_with_words_joins_its_request_and_a_yeah_after_the_endpoint_does_not() -> None:
    s = Replying(typed=False, rejoin_window_ms=1000)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
    assert s.send(s.core.heard(1, "Turn off the lights")) == [Reply(1, "Turn off the lights", "voice")]
    s.hearing = "yeah"
    s.silent(200).speak(300)  # right after the endpoint
    opened = s.of(OpenTurn)[1]
    assert opened.joins == 1 and opened.holds == 1 and opened.during_reply
    s.silent(200)
    assert s.of(Join) == [] and s.of(Interrupt) == [] and [type(a) for _, a in s.actions[-2:]] == [Release, DropTurn]
    s.hearing = "in the living room"
    s.silent(100).speak(400)  # still within the window of the endpoint
    assert s.of(Join) == [Join(3, 1)] and s.of(Interrupt) == [Interrupt(1, s.of(Interrupt)[0].t_ms, "rejoin")]
    s.send(s.core.reply_ended(1, interrupted=True))
    end = s.silent_until(CheckTurn)
    (end,) = s.send(s.core.check_done(3, end.check, None, 0.9, 10.0))
    assert end.joins == 1


def test_a_continuation_before_the_transcript_arrives_takes_the_request_over_once_it_has_words() -> None:
    s = Replying(typed=False)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
    s.hearing = "a table for four"
    s.silent(300).speak(300)
    assert s.of(OpenTurn)[1].joins == 1 and s.of(OpenTurn)[1].holds is None  # no reply plays yet: nothing to hold
    assert s.of(Join) == [Join(2, 1)] and s.of(Interrupt) == []
    assert s.core.heard(1, "I would like") == []  # the early turn's transcript comes late: ignored


def test_speech_over_the_last_audio_of_a_reply_sent_whole_is_an_interjection_of_it() -> None:
    s = Replying()
    s.send(s.core.reply_ended(1, interrupted=False, audible_ms=800.0))  # sent whole; 0.8 s of it still plays
    s.hearing = "a good day for a walk in the park"  # its own last words, back through the microphone
    s.speak(300).silent(100)
    assert s.of(OpenTurn)[0].holds == 1 and s.of(Interrupt) == [] and len(s.of(DropTurn)) == 1
    s.hearing = "wait stop"
    s.speak(300)  # still within its playback and echo: a real interruption stops what is left of it
    assert s.of(Interrupt) == [Interrupt(1, s.of(Interrupt)[0].t_ms, "barge_in")]
    s.send(s.core.reply_ended(1, interrupted=True))
    s2 = Replying()
    s2.send(s2.core.reply_ended(1, interrupted=False, audible_ms=200.0))
    s2.silent(600).speak(300)  # after its playback and the echo's tail: a new turn like any other
    assert s2.of(OpenTurn)[0].holds is None and not s2.of(OpenTurn)[0].during_reply


def test_a_mark_that_says_a_reply_sent_whole_has_played_ends_its_playback_while_the_audio_clock_stands_still() -> None:
    # The greeting is sent whole before the user starts the microphone: no audio comes, so the audio clock does not
    # move while it plays. The client's last mark says all of it played: speech after that is a turn of its own.
    s = Replying()
    s.send(s.core.reply_ended(1, interrupted=False, audible_ms=3000.0))
    assert s.send(s.core.played(1, 2400.0, unplayed_ms=600.0)) == []
    s.send(s.core.played(1, 3000.0, unplayed_ms=0.0))
    s.silent(400).speak(300)  # the microphone starts; the user speaks after the echo's tail
    assert s.of(OpenTurn)[0].holds is None and not s.of(OpenTurn)[0].during_reply
    s2 = Replying()
    s2.send(s2.core.reply_ended(1, interrupted=False, audible_ms=3000.0))
    s2.send(s2.core.played(1, 600.0, unplayed_ms=2400.0))  # still playing: speech now is over it
    s2.silent(400).speak(300)
    assert s2.of(OpenTurn)[0].holds == 1


@pytest.mark.parametrize("reply_after_ms", [300, 900, 1500])
def test_speech_once_the_reply_is_heard_is_about_the_reply_not_more_of_the_request(reply_after_ms: int) -> None:
    """However late the reply starts after the endpoint (a slower machine), words said 0.6-1 s into hearing it are
    an interruption of it, never joined to the request; words said before it could be heard still join."""
    for into_reply_ms, joins in ((600, False), (1000, False), (-200, True)):
        s = Replying(typed=False, rejoin_window_ms=1000)
        s.speak(600)
        check = s.silent_until(CheckTurn)
        s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
        s.send(s.core.heard(1, "Tell me a long story about a lighthouse keeper"))
        if into_reply_ms < 0:  # before the reply is heard, within the rejoin window
            s.silent(min(reply_after_ms + into_reply_ms, 700))
            s.hearing = "on a stormy night"
            s.speak(300)
            s.send(s.core.played(1, 0.0))  # its first mark comes in after the speech began
            s.speak(200)
        else:
            s.silent(reply_after_ms)
            s.send(s.core.played(1, 0.0))  # the client starts playing the reply
            s.silent(into_reply_ms)
            s.hearing = "wait stop" if joins is False and into_reply_ms == 1000 else "tell me another one"
            s.speak(500)
        opened = s.of(OpenTurn)[1]
        s.silent(300)
        assert (s.of(Join) == [Join(opened.turn_id, 1)]) is joins, (reply_after_ms, into_reply_ms, s.of(Join))
        interrupt = s.of(Interrupt)
        assert interrupt and interrupt[0].reason == ("rejoin" if joins else "barge_in")


def test_without_playback_marks_the_rejoin_window_alone_decides() -> None:
    s = Replying(typed=False, rejoin_window_ms=1000)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
    s.send(s.core.heard(1, "Turn off the lights"))
    s.hearing = "in the living room"
    s.silent(700).speak(400)
    assert s.of(Join) == [Join(2, 1)]


@pytest.mark.parametrize("text", ["Um...", "Hmm, let me think.", "Uh, one second.", "So... let me see.", "Give me a moment.",
                                  "Em...", "And let me think.", "at one second"])  # a filler the recogniser misspelt
def test_a_turn_of_the_user_thinking_aloud_gets_silence_not_a_reply(text: str) -> None:
    assert only_thinking(text, Lexicon.of())
    s = Replying(typed=False)
    s.speak(600)
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(1, check.check, None, 0.5, 10.0))
    assert s.send(s.core.heard(1, text)) == []  # nothing answers it
    s.silent(1500)
    s.hearing = "what is the capital of France"
    s.speak(600)  # the request, after the thinking: a turn of its own, answered
    assert s.of(OpenTurn)[1].joins is None
    check = s.silent_until(CheckTurn)
    s.send(s.core.check_done(2, check.check, None, 0.9, 10.0))
    assert s.send(s.core.heard(2, "What is the capital of France?")) == [Reply(2, "What is the capital of France?", "voice")]


@pytest.mark.parametrize("text", ["Are you there?", "Um, what time is it?", "Hmm.. tell me a joke", "Let me think about dinner ideas.",
                                  "The.", "I'm letting me think.", "Well, is it?", "So can you?"])
def test_anything_said_beside_the_thinking_is_a_request(text: str) -> None:
    assert not only_thinking(text, Lexicon.of())
    assert not only_thinking("", Lexicon.of())
    assert only_thinking("Eh bien.", Lexicon.of(thinking=["eh bien", "euh"]))  # the list is configurable
