"""Turn-taking: every decision about who holds the floor, in one pure state machine.

Events in: VAD frames (a speech probability at an audio time), end-of-turn check results, what speech over a reply
said, the final transcript of an ended turn, typed turns, greetings and cancels, the end of a reply, playback
marks. Actions out: open a turn, start or drop the work ahead of the endpoint, run a check, recognise an
interjection, end or drop a turn, join a request, interrupt or resume a reply, reply, correct the history (each a
frozen dataclass of voice.turn_actions). No asyncio, no clock of its own (audio time comes with the frames), no
models, no I/O: voice.session runs what it asks for. The decision rules and their measurements: docs/turn-taking.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from voice.endpointer import Endpointer, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted
from voice.interjection import Heard, Kind, Verdict, classify, only_stop_words, only_thinking
from voice.turn_actions import (
    Action,
    CheckTurn,
    Correct,
    DropAhead,
    DropTurn,
    EndTurn,
    Interrupt,
    Join,
    OpenTurn,
    Recognise,
    Release,
    Reply,
    StartAhead,
)
from voice.turn_policy import TurnCheck, TurnPolicy

# the actions (voice.turn_actions) are imported from here too: the machine and what it returns, in one place
__all__ = ["TurnTaking", "Action", "OpenTurn", "Recognise", "Join", "Release", "StartAhead", "DropAhead", "CheckTurn",
           "EndTurn", "DropTurn", "Interrupt", "Reply", "Correct", "ECHO_TAIL_MS", "MAX_AUDIBLE_MS"]  # fmt: skip

ECHO_TAIL_MS = 300.0  # a room's echo of the last word, and the client's output latency, after its playback ends
MAX_AUDIBLE_MS = 5000.0  # a reply's unplayed audio is counted at most this long (a client that stopped playing)


# -- the machine ---------------------------------------------------------------------------------------------


@dataclass
class _Heard:
    """The user turn being heard."""

    turn_id: int
    start_ms: float
    during_reply: bool
    joins: int | None
    barged: bool = False
    pause_ms: float | None = None  # audio time the current silence began
    ahead: bool = False
    check: int = 0  # checks asked so far; a result for an earlier one is stale
    answered: int = 0  # the last check whose result came in
    asked: bool = False  # a check was asked in this silence
    asked_ms: float = 0.0  # audio time the last check was asked
    end_after_ms: float | None = None  # the silence after which this pause ends the turn (set by a check)
    checks: list[TurnCheck] = field(default_factory=list)
    # an interjection decided by its words (interrupt_by "words")
    may_join: tuple[int, float] | None = None  # (turn, endpoint ms) it would continue, until its words decide
    holds: int | None = None  # the reply held for it, until released or interrupted
    asked_n: int = 0  # recognitions asked; one runs at a time
    answered_n: int = 0
    asked_audio_ms: float = 0.0  # audio time of the last ask
    final_n: int | None = None  # the recognition asked in this pause: its verdict is on the whole interjection
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def is_turn(self) -> bool:
        return not self.during_reply or self.barged


class TurnTaking:
    """The floor: who speaks, when a turn ends, which reply runs. Call `listen(frame_ms, end_lag_ms)` once the VAD
    is known, then feed events; every method returns the actions to run, in order."""

    def __init__(self, policy: TurnPolicy, vad_threshold: float = 0.5, first_turn: int = 1) -> None:
        self.policy = policy
        self.vad_threshold = vad_threshold
        self._endpointer: Endpointer | None = None
        self._next_turn = first_turn  # a conversation carried on by a new connection goes on counting
        self._heard: _Heard | None = None
        self._answering: int | None = None  # ended voice turn waiting for its final transcript
        self._last_end: tuple[int, float] | None = None  # (turn, audio ms of its endpoint) while it may be rejoined
        self._reply: int | None = None  # the turn whose reply runs
        self._audible: tuple[int, float] | None = None  # a reply sent whole, and the audio time its playback ends
        self._heard_from: tuple[int, float] | None = None  # a reply, and the audio time it became audible (first mark)
        self._last_interrupted: int | None = None  # a late playback mark for it still corrects the history
        self._now_ms = 0.0
        self._vad: tuple[float, float] | None = None  # (frame_ms, end_lag_ms) given to listen()
        self._retuned = False  # a new policy waits for the turn being heard to end

    def listen(self, frame_ms: float, end_lag_ms: float = 0.0) -> None:
        self._vad = (frame_ms, end_lag_ms)
        p = self.policy
        hangover = p.hangover_ms if p.detection == "fixed" else p.max_hangover_ms
        self._endpointer = Endpointer(frame_ms, self.vad_threshold, p.min_speech_ms, hangover, end_lag_ms=end_lag_ms)

    def retune(self, policy: TurnPolicy, vad_threshold: float) -> None:
        """Another policy: at once between turns, else once the turn being heard ends."""
        self.policy, self.vad_threshold = policy, vad_threshold
        self._retuned = True
        self._apply_retune()

    def _apply_retune(self) -> None:
        if self._retuned and self._heard is None and self._vad is not None:
            self._retuned = False
            self.listen(*self._vad)

    @property
    def state(self) -> str:
        """listening (the user speaks) | responding (a reply runs) | idle."""
        if self._heard is not None:
            return "listening"
        return "responding" if self._reply is not None else "idle"

    @property
    def hearing(self) -> int | None:
        """The turn being heard, if any."""
        return None if self._heard is None else self._heard.turn_id

    @property
    def last_turn(self) -> int:
        """The newest turn id handed out (0 before the first)."""
        return self._next_turn - 1

    @property
    def replying_to(self) -> int | None:
        """The turn whose reply runs, or is about to: a reply asked for earlier and not started yet is superseded."""
        return self._reply

    # -- the user's audio ------------------------------------------------------------------------------------

    def frame(self, prob: float, t_ms: float) -> list[Action]:
        """One VAD frame: its speech probability and the audio time of its first sample."""
        ep = self._endpointer
        if ep is None:
            raise RuntimeError("listen() first: the VAD's frame length is not known")
        self._now_ms = t_ms + ep.frame_ms
        out: list[Action] = []
        for event in ep.push(prob, t_ms):
            if isinstance(event, SpeechStarted):
                out += self._open(event.t_ms)
            elif isinstance(event, SpeechPaused):
                out += self._pause(event.t_ms)
            elif isinstance(event, SpeechResumed):
                out += self._resume()
            elif isinstance(event, SpeechEnded):
                out += self._silence_ended(event.t_ms)
        return out + self._tick()

    def check_done(self, turn_id: int, check: int, audio_prob: float | None, text_prob: float | None, cost_ms: float,
                   text: str | None = None) -> list[Action]:
        """A check's result; `text`: the turn's transcript at the pause, where the work ahead has it."""
        h = self._heard
        if h is None or h.turn_id != turn_id:
            return []  # the turn ended meanwhile (its hangover ran out)
        silence = self._now_ms - h.pause_ms if h.pause_ms is not None else 0.0
        h.answered = max(h.answered, check)
        if check != h.check or h.pause_ms is None:
            h.checks.append(TurnCheck(silence, audio_prob, text_prob, None, None, cost_ms, "stale"))
            return []
        prob = self.policy.complete_prob(audio_prob, text_prob)
        wait = self.policy.wait_ms(prob)
        if h.barged and text is not None and only_stop_words(text, self.policy.lexicon):
            wait = self.policy.max_hangover_ms  # "No, ..." after a barge-in: the reply stopped already, let them go on
        h.end_after_ms = wait
        ends = silence >= wait
        h.checks.append(TurnCheck(silence, audio_prob, text_prob, prob, wait, cost_ms, "end" if ends else "wait"))
        return self._end(h, "complete") if ends else []

    def _open(self, start_ms: float) -> list[Action]:
        p, last = self.policy, self._last_end
        self._last_end = None
        if not (last is not None and p.rejoin_window_ms > 0 and start_ms - last[1] <= p.rejoin_window_ms
                and self._unheard(last[0], start_ms)):  # fmt: skip
            last = None
        turn_id = self._new_turn()
        over = self._reply if self._reply is not None else self._playing()
        if p.interrupt_by == "words" and (last is not None or over is not None):
            # an interjection: the reply (if one plays) pauses now, and the words decide whether it stops
            h = _Heard(turn_id, start_ms, True, None, may_join=last, holds=over)
            self._heard = h
            opened = OpenTurn(turn_id, start_ms, True, last[0] if last is not None else None, over)
            return [opened, *self._ask(h)]
        out: list[Action] = []
        joins = None
        if last is not None:  # duration: the continuation joins at once
            joins = last[0]
            if self._reply == joins:
                out.append(Interrupt(joins, self._now_ms, "rejoin"))
            self._answering = None
        during = self._reply is not None and joins is None
        self._heard = _Heard(turn_id, start_ms, during, joins)
        out.append(OpenTurn(turn_id, start_ms, during, joins))
        return out + ([Join(turn_id, joins)] if joins is not None else [])

    def _pause(self, t_ms: float) -> list[Action]:
        h = self._heard
        if h is not None:
            h.pause_ms, h.asked, h.end_after_ms = t_ms, False, None
        return []

    def _resume(self) -> list[Action]:
        h = self._heard
        if h is None:
            return []
        h.pause_ms, h.asked, h.end_after_ms = None, False, None
        h.final_n = None  # a recognition asked in the pause no longer covers the whole interjection
        if h.ahead:
            h.ahead = False
            return [DropAhead(h.turn_id)]
        return []

    def _silence_ended(self, speech_end_ms: float) -> list[Action]:
        """The endpointer's own hangover ran out: the fixed hangover, or the longest silence a turn may hold."""
        h = self._heard
        if h is None:
            return []
        if not h.is_turn:
            return self._drop(h)
        return self._end(h, "silence" if self.policy.detection == "fixed" else "max_hangover")

    def _tick(self) -> list[Action]:
        """Decisions that come with time: barge-in, a check due, a wait that ran out, a backchannel over."""
        h, p = self._heard, self.policy
        if h is None:
            return []
        if self._now_ms - h.start_ms >= p.max_turn_ms:
            return self._end(h, "max_length") if h.is_turn else self._drop(h)
        if not h.is_turn and p.interrupt_by == "words":
            return self._interject_tick(h)
        if h.pause_ms is None:
            if not h.is_turn and self._now_ms - h.start_ms >= p.barge_in_min_speech_ms:
                h.barged = True  # long enough to be meant: a turn, and the reply (if one still runs) stops
                return [Interrupt(self._reply, self._now_ms, "barge_in")] if self._reply is not None else []
            return []
        silence = self._now_ms - h.pause_ms
        if not h.is_turn:
            return self._drop(h) if p.detection != "fixed" and silence >= p.turn_check_ms else []
        out: list[Action] = []
        if not h.ahead and silence >= p.ahead_silence_ms:
            h.ahead = True
            out.append(StartAhead(h.turn_id))
        if p.detection == "fixed":
            return out
        if not h.asked and silence >= p.turn_check_ms:
            h.asked, h.asked_ms = True, self._now_ms
            h.check += 1
            return [*out, CheckTurn(h.turn_id, h.check, silence)]
        if h.end_after_ms is not None and silence >= h.end_after_ms:
            return [*out, *self._end(h, "complete")]
        return out

    def _end(self, h: _Heard, reason: str) -> list[Action]:
        assert self._endpointer is not None
        if h.asked and h.answered < h.check and h.pause_ms is not None:  # the hold ran out first: the trace says so
            waited = self._now_ms - h.asked_ms
            h.checks.append(TurnCheck(self._now_ms - h.pause_ms, None, None, None, None, waited, "unanswered"))
        speech_end_ms = self._endpointer.speech_end_ms
        if self._endpointer.in_speech:
            self._endpointer.end()
        self._heard = None
        self._answering = h.turn_id
        self._last_end = (h.turn_id, self._now_ms)
        self._apply_retune()
        return [EndTurn(h.turn_id, speech_end_ms, reason, tuple(h.checks), h.joins)]

    def _drop(self, h: _Heard) -> list[Action]:
        assert self._endpointer is not None
        out = self._release(h, h.verdicts[-1].kind.value if h.verdicts else "unsure")
        speech_end_ms = self._endpointer.speech_end_ms
        if self._endpointer.in_speech:
            self._endpointer.end()
        self._heard = None
        if h.may_join is not None and self._last_end is None and h.may_join[0] in (self._answering, self._reply):
            self._last_end = h.may_join  # a "yeah" after an endpoint: a continuation after it may still join
        self._apply_retune()
        return [*out, DropTurn(h.turn_id, speech_end_ms)]

    # -- interjections: speech that may interrupt, decided by its words (interrupt_by "words") ----------------

    def interjection_heard(self, turn_id: int, n: int, heard: Heard, recent_reply_words: Sequence[str]) -> list[Action]:
        """The words of an interjection so far (asked by Recognise(turn_id, n)); `recent_reply_words`: what the
        replies said lately, normalised (voice.interjection.words), so that their echo is known for what it is."""
        h = self._heard
        if h is None or h.turn_id != turn_id or h.is_turn:
            return []  # dropped or ended meanwhile, or it has interrupted already
        h.answered_n = max(h.answered_n, n)
        verdict = classify(heard, recent_reply_words, self.policy.lexicon, final=n == h.final_n)
        h.verdicts.append(verdict)
        if verdict.interrupts:
            return self._take_floor(h)
        if n == h.final_n:
            return self._drop(h)  # all of it heard, and it was no interruption: the reply resumes
        out: list[Action] = []
        if verdict.kind in (Kind.NONE, Kind.ECHO) and self._now_ms - h.start_ms >= self.policy.interject_release_ms:
            out += self._release(h, verdict.kind.value)  # long enough to say: noise or echo that goes on
        return out + self._interject_tick(h)

    def _interject_tick(self, h: _Heard) -> list[Action]:
        p = self.policy
        out: list[Action] = []
        if h.holds is not None and self._now_ms - h.start_ms >= p.interject_max_hold_ms:
            out += self._release(h, "unsure")
        if h.pause_ms is not None and h.final_n is None:
            return out + self._ask(h, final=True)  # the user paused: a verdict on the whole of it, now
        step = p.interject_step_ms * (1 if h.holds is not None else 4)  # released: no one waits, look less often
        if h.pause_ms is None and self._now_ms - h.asked_audio_ms >= step:
            return out + self._ask(h)
        return out

    def _ask(self, h: _Heard, final: bool = False) -> list[Action]:
        if h.answered_n < h.asked_n and not final:
            return []  # one recognition at a time while it grows; the pause's does not wait for one in flight
        h.asked_n += 1
        h.asked_audio_ms = self._now_ms
        if final:
            h.final_n = h.asked_n
        return [Recognise(h.turn_id, h.asked_n)]

    def _take_floor(self, h: _Heard) -> list[Action]:
        """A real interruption: the interjection is a turn, a continuation joins its request, the reply stops."""
        h.barged, h.holds = True, None
        out: list[Action] = []
        joins = h.may_join[0] if h.may_join is not None and self._unheard(h.may_join[0], h.start_ms) else None
        h.may_join = None
        if joins is not None:
            h.joins = joins
            if self._answering == joins:
                self._answering = None  # its transcript, when it comes, starts no reply: this turn answers all of it
            out.append(Join(h.turn_id, joins))
        over = self._reply if self._reply is not None else self._playing()
        if over is not None:
            out.append(Interrupt(over, self._now_ms, "rejoin" if over == joins else "barge_in"))
            self._audible = None
        return out

    def _unheard(self, turn_id: int, start_ms: float) -> bool:
        """Whether speech that began at `start_ms` began before the user could react to the reply to `turn_id`: its
        first playback mark is not in yet, or came less than rejoin_react_ms before (audio time, the mark's own played
        audio counted back). A client without marks keeps the rejoin window alone."""
        heard = self._heard_from
        return heard is None or heard[0] != turn_id or start_ms < heard[1] + self.policy.rejoin_react_ms

    def _playing(self) -> int | None:
        """The reply sent whole whose audio the client is still playing, if any."""
        if self._audible is not None and self._now_ms < self._audible[1]:
            return self._audible[0]
        return None

    def _release(self, h: _Heard, reason: str) -> list[Action]:
        if h.holds is None:
            return []
        reply, h.holds = h.holds, None
        return [Release(reply, h.turn_id, self._now_ms, reason, " ".join(h.verdicts[-1].words) if h.verdicts else "")]

    # -- replies -----------------------------------------------------------------------------------------------

    def heard(self, turn_id: int, text: str) -> list[Action]:
        """The final transcript of an ended turn: reply to it, unless it has no words or was joined meanwhile."""
        if self._answering != turn_id:
            return []
        self._answering = None
        if not text.strip() or only_thinking(text, self.policy.lexicon):  # no words, or "um... let me think": silence
            self._last_end = None
            return []
        return self._start_reply(turn_id, text, "voice")

    def typed(self, text: str) -> list[Action]:
        return self._start_reply(self._new_turn(), text, "text")

    def greet(self) -> list[Action]:
        return self._start_reply(self._new_turn(), None, "greeting")

    def cancel(self) -> list[Action]:
        return [Interrupt(self._reply, None, "cancel")] if self._reply is not None else []

    def reply_ended(self, turn_id: int, interrupted: bool, audible_ms: float = 0.0) -> list[Action]:
        """The reply's task ended; `audible_ms`: how much of its audio the client has still to play (and its echo
        then dies down ECHO_TAIL_MS later): speech until then is an interjection over it, as over a running reply."""
        if audible_ms > 0:
            self._audible = (turn_id, self._now_ms + min(audible_ms, MAX_AUDIBLE_MS) + ECHO_TAIL_MS)
        if self._reply == turn_id:
            self._reply = None
        if interrupted:
            self._last_interrupted = turn_id
        if self._last_end is not None and self._last_end[0] == turn_id:
            self._last_end = None  # its reply is over: later speech is a new request
        return []

    def played(self, turn_id: int, played_ms: float, unplayed_ms: float | None = None) -> list[Action]:
        """A playback mark. For the reply interrupted last, a mark (even one after the clear) fixes the history. For a
        reply sent whole, `unplayed_ms` (what of it the client has yet to play, by this mark) says when it falls silent:
        a client's word beats reply_ended's estimate (the audio clock stands still while no microphone audio comes)."""
        if self._heard_from is None or turn_id > self._heard_from[0]:  # a newer reply's first mark (not a late one's)
            self._heard_from = (turn_id, self._now_ms - played_ms)  # audible since then
        if unplayed_ms is not None and self._audible is not None and self._audible[0] == turn_id:
            self._audible = (turn_id, self._now_ms + min(max(unplayed_ms, 0.0), MAX_AUDIBLE_MS) + ECHO_TAIL_MS)
        return [Correct(turn_id, played_ms)] if turn_id == self._last_interrupted else []

    def _start_reply(self, turn_id: int, text: str | None, kind: str) -> list[Action]:
        out: list[Action] = []
        if self._reply is not None:
            out.append(Interrupt(self._reply, None, "replaced"))  # one reply at a time: the new turn ends the old
        if self._last_end is not None and self._last_end[0] != turn_id:
            self._last_end = None  # another reply starts: speech now is no continuation of that earlier turn
        self._reply = turn_id
        return [*out, Reply(turn_id, text, kind)]

    def _new_turn(self) -> int:
        turn_id, self._next_turn = self._next_turn, self._next_turn + 1
        return turn_id
