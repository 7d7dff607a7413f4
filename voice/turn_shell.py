"""The session's hands for turn-taking: what voice.turntaking asks for (open, pause, check, end or drop a turn,
recognise an interjection, start or release a reply), run with its session's Listener and Replies.

voice.session's Session is the host; this knows it by the TurnHost shape alone.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from voice.interjection import Heard, only_thinking
from voice.listener import Listener, Utterance
from voice.replies import Replies
from voice.reply_host import ReplyHost
from voice.trace import TurnTrace
from voice.turntaking import (
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
    StartAhead,
)
from voice.turntaking import Reply as ReplyTo

log = logging.getLogger(__name__)


class TurnHost(ReplyHost, Protocol):
    listener: Listener  # hears the user's turns
    replies: Replies  # speaks the replies
    auto_reply: bool  # a finished turn is answered at once (else the history waits for respond())

    def new_trace(self, turn_id: int, kind: str) -> TurnTrace: ...

    def add_user(self, text: str) -> None: ...


class TurnShell:
    def __init__(self, session: TurnHost) -> None:
        self.s = session
        self.ended: Utterance | None = None  # the voice turn ended last, while a continuation may still join it
        self.finishing: asyncio.Task[Any] | None = None  # its final transcript, then its reply's start

    def apply(self, actions: Sequence[Action], typed: TurnTrace | None = None) -> None:
        """Run what turn-taking asked for (also called by voice.replies as replies end)."""
        self.s.preempt.follow(actions)  # the held first phrase: dropped, kept or used (voice.preemption)
        for a in actions:
            if isinstance(a, OpenTurn):
                self._open_turn(a)
            elif isinstance(a, StartAhead):
                self._start_ahead(a.turn_id)
            elif isinstance(a, DropAhead):
                if (utt := self.hearing(a.turn_id)) is not None:
                    utt.resume()
            elif isinstance(a, CheckTurn):
                self.s.spawn(self._check_turn, a)
            elif isinstance(a, Recognise):
                self.s.spawn(self._recognise, a)
            elif isinstance(a, Join):
                self._join(a)
            elif isinstance(a, Release):
                log.info("session %s: speech %d over turn %d's reply was no interruption (%s: %r); it resumes",
                         self.s.session_id, a.turn_id, a.reply_turn, a.reason, a.heard)  # fmt: skip
                self.s.replies.release(a)
            elif isinstance(a, EndTurn):
                self._end_turn(a)
            elif isinstance(a, DropTurn):
                self._drop_turn(a)
            elif isinstance(a, Interrupt):
                if self.s.echo is not None:
                    self.s.echo.stop()
                self.s.replies.interrupt(a.turn_id, a.t_ms)
            elif isinstance(a, ReplyTo):  # a voice turn's trace is its utterance's; a typed one's comes along
                utt = self.ended if self.ended is not None and self.ended.turn_id == a.turn_id else None
                self.s.spawn(self.s.replies.start, a, utt.trace if utt is not None else typed, utt)
            elif isinstance(a, Correct):  # a playback mark that came after its reply was interrupted
                self.s.memory.correct(a.turn_id, a.played_ms)

    def hearing(self, turn_id: int) -> Utterance | None:
        utt = self.s.listener.utt
        return utt if utt is not None and utt.turn_id == turn_id else None

    def _open_turn(self, a: OpenTurn) -> None:
        trace = self.s.new_trace(a.turn_id, "voice")
        trace.mark("speech_start", self.s.listener.arrival_ns(a.start_ms))
        ended = self.ended if a.joins is not None and self.ended is not None and self.ended.turn_id == a.joins else None
        self.s.listener.open(a.turn_id, trace, a.start_ms, ended)  # with the request it may continue, from its start
        extra = {"holds": a.holds} if a.holds is not None else {}
        self.s.outbox.send("vad.speech_started", turn_id=a.turn_id, t_ms=round(a.start_ms, 1), interjection=a.during_reply, **extra)

    def _join(self, a: Join) -> None:
        """The speech continues the request of turn `a.joins`: that turn's reply never starts (or was stopped)."""
        utt = self.hearing(a.turn_id)
        if utt is not None:
            utt.trace.info["joins"] = a.joins
        ended = self.ended
        if ended is not None and ended.turn_id == a.joins:
            ended.trace.info["joined_into"] = a.turn_id
            if self.finishing is not None and not self.finishing.done():
                self.finishing.cancel()  # its reply never starts: the trace goes to the log as it is
                self.s.replies.send_trace(ended.trace)
            self.ended = None
        self.s.outbox.send("turn.joined", turn_id=a.turn_id, joins=a.joins)

    async def _recognise(self, a: Recognise) -> None:
        """The words of an interjection so far, for turn-taking to judge (voice.interjection)."""
        utt = self.hearing(a.turn_id)
        if utt is None:
            return
        try:
            heard = await self.s.listener.interjection(utt)
        except (OSError, RuntimeError, ValueError) as exc:  # no words known: it cannot interrupt; the pause decides
            log.warning("session %s: interjection recognition failed: %r", self.s.session_id, exc)
            heard = Heard("", 0.0, 0.0)
        utt.trace.info.setdefault("interjection", []).append(
            {"n": a.n, "text": heard.text, "logprob": round(heard.avg_logprob, 2), "ms": round(heard.audio_ms, 1)})
        self.apply(self.s.turns.interjection_heard(a.turn_id, a.n, heard, self.s.replies.recent_words()))

    def _start_ahead(self, turn_id: int) -> None:
        utt = self.hearing(turn_id)
        if utt is None:
            return
        utt.pause()
        policy = self.s.settings.turns
        joins = utt.trace.info.get("joins")
        utt.ahead = self.s.spawn(self._ahead, utt, lambda text: self.s.messages(text, joins))
        if self.s.settings.audio_check_ahead and policy.uses_audio:  # after the ahead: it may wait for that work
            after_text = policy.audio_can_change if policy.uses_text else None
            self.s.listener.score_ahead(utt, policy.ahead_silence_ms, policy.turn_check_ms, after_text=after_text)

    async def _ahead(self, utt: Utterance, prompt: Callable[[str], list[tuple[str, str]]]) -> None:
        """The work ahead of the endpoint (voice.listener), then the reply's first phrase (voice.first_phrase)."""
        await self.s.listener.ahead(utt, prompt, self.s.settings.turns.uses_text)
        if self.s.preempt.core.enabled:
            self.s.preempt.after_ahead(utt)

    async def _check_turn(self, a: CheckTurn) -> None:
        utt = self.hearing(a.turn_id)
        if utt is None:
            return
        policy = self.s.settings.turns
        audio_prob, text_prob, cost_ms = await self.s.listener.check(utt, policy.uses_audio, policy.uses_text)
        text = utt.final_text if utt.final_ns is not None else None  # the work ahead's transcript, when it has one
        self.apply(self.s.turns.check_done(a.turn_id, a.check, audio_prob, text_prob, cost_ms, text))

    def _end_turn(self, a: EndTurn) -> None:
        utt = self.hearing(a.turn_id)
        if utt is None:
            return
        self.s.listener.close(utt)
        trace = utt.trace
        # the last voiced sample lies just before speech_end_ms; the message that carried it arrived at:
        trace.mark("speech_end", self.s.listener.arrival_ns(a.speech_end_ms - 0.001))
        trace.mark("endpoint")
        trace.info["turn"] = {"end": a.reason, "checks": [c.to_dict() for c in a.checks]}
        self.s.outbox.send("vad.speech_ended", turn_id=a.turn_id, t_ms=round(a.speech_end_ms, 1))
        self.ended = utt
        self.finishing = self.s.spawn(self._finish_turn, utt)

    def _drop_turn(self, a: DropTurn) -> None:
        utt = self.hearing(a.turn_id)
        if utt is not None:
            self.s.listener.close(utt)
            utt.discard()
        self.s.outbox.send("vad.speech_ended", turn_id=a.turn_id, t_ms=round(a.speech_end_ms, 1), dropped=True)

    async def partial(self, utt: Utterance) -> None:
        text = await self.s.listener.partial(utt)
        if utt is not self.s.listener.utt:
            return
        if text is not None:
            self.s.outbox.send("transcript.partial", turn_id=utt.turn_id, text=text)
        warming = utt.warm_task is not None and not utt.warm_task.done()
        local = self.s.stages.llm.local_cache  # a remote server caches prefixes on its own
        if self.s.settings.warm_partials and local and not utt.paused and not warming and self.s.preempt.busy() is None:
            joins = utt.trace.info.get("joins")
            utt.warm_task = self.s.spawn(self.s.listener.warm, utt, lambda words: self.s.messages(words, joins))

    async def _finish_turn(self, utt: Utterance) -> None:
        """After the endpoint: the final transcript (from the pause when it ran there), then the reply."""
        text = await self.s.listener.final(utt)
        utt.trace.mark("asr_final", utt.final_ns)
        utt.trace.info.setdefault("queue_ms", {}).update(utt.queue_ms)
        self.s.outbox.send("transcript.final", turn_id=utt.turn_id, text=text)
        actions = self.s.turns.heard(utt.turn_id, text)
        if actions and not self.s.auto_reply:  # heard, not answered: the history waits for respond()
            actions = [a for a in actions if not isinstance(a, ReplyTo)]
            self.apply(self.s.turns.reply_ended(utt.turn_id, interrupted=False))
            self.s.add_user(text)
        if not any(isinstance(a, ReplyTo) for a in actions):
            self.s.preempt.no_reply(utt.turn_id)
        if not actions:
            if not text.strip():  # no words (noise, or its own echo, that took the floor): the log still says why
                utt.trace.info["no_words"] = True
                self.s.replies.send_trace(utt.trace)
            elif only_thinking(text, self.s.turns.policy.lexicon):  # "um... let me think": silence, said in the log
                utt.trace.info["thinking"] = True
                self.s.replies.send_trace(utt.trace)
            utt.discard()
            if self.ended is utt:
                self.ended = None
        self.apply(actions)
