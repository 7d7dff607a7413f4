"""A session's replies, one at a time: start one from the history and the engine (or a fixed greeting), interrupt
it, end it into the history, and send its trace once the client says when playback began.

The reply half of voice.session: turn-taking decides when a reply starts or stops, the session hears the user and
holds the conversation, this runs the replies. One Reply (voice.reply) speaks each.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import replace
from typing import Any

from llm_engine.constrain import Constraint
from llm_engine.request import ChatMessage
from llm_engine.tool_calls import ArgumentsDelta, CallDone, CallStarted, Delta
from llm_engine.tool_format import call_text

from voice.audio import SAMPLE_RATE, resample
from voice.first_phrase import HeldPhrase
from voice.history import reply_content
from voice.summary import SLACK
from voice.interjection import words
from voice.listener import Utterance
from voice.llm_bridge import LlmCall, LlmError, LlmEvent, LlmFinish, LlmToken, ToolAsk
from voice.reply import Reply
from voice.reply_host import ReplyHost
from voice.timers import Timers
from voice.tool_turn import CALL_TOKENS, reply_choice, session_tools, tool_reply
from voice.trace import TurnTrace, now_ns
from voice.turntaking import Release as ReleaseHold
from voice.turntaking import Reply as ReplyTo

log = logging.getLogger(__name__)

# A reply whose audio was sent holds its turn.trace this long for the client's first playback.mark, so
# the trace carries playback_start even when the whole reply was sent before the client began playing.
TRACE_HOLD_S = 1.0
PLAYED_SLACK_MS = 1000.0  # a playback mark may run this far past the audio sent (rounding, pieces in flight)
RECENT_WORDS = 60  # the replies' last words an interjection is compared with (about 20 s of speech)


class LlmFailed(RuntimeError):
    """The engine reported an error for this request."""


class Replies:
    def __init__(self, session: ReplyHost) -> None:
        self.s = session
        self.current: Reply | None = None  # the reply launched last
        self.task: asyncio.Task[None] | None = None  # its task
        self.held: dict[int, TurnTrace] = {}  # finished turns' traces waiting for their first playback mark
        self.warm_shared = 0  # prompt tokens warm-ups copied from other sessions' slots since the last reply
        self._start_lock = asyncio.Lock()
        self._last_text = ""  # the reply before the current one (its echo can still be in the air)
        self.timers = Timers(session.spawn, lambda: session.turns.state == "idle", self.announce)  # set_timer's (voice.timers)

    def running(self, turn_id: int) -> Reply | None:
        """The reply of `turn_id` while its task still runs (ending, perhaps), else None."""
        reply, task = self.current, self.task
        return reply if reply is not None and reply.turn_id == turn_id and task is not None and not task.done() else None

    def audible(self, turn_id: int) -> Reply | None:
        """The latest reply, if it is `turn_id`'s and was not stopped: running, or sent whole and still playing on
        the client (its marks, its pauses for speech over it included, still say where its echo is)."""
        reply = self.current
        return reply if reply is not None and reply.turn_id == turn_id and not reply.stopped else None

    def check_mark(self, turn_id: int, played_ms: float) -> str | None:
        """Why a playback mark cannot be true (more played than was sent), or None."""
        for known in (self.current, self.s.memory.interrupted):
            if known is not None and known.turn_id == turn_id and played_ms > known.sent_ms + PLAYED_SLACK_MS:
                return f"{played_ms:.0f} ms played of {known.sent_ms:.0f} ms sent"
        return None

    def played(self, turn_id: int, played_ms: float, arrival_ns: int) -> None:
        """The client's playback mark: how much it played, and so when playback began."""
        reply = self.current
        if reply is not None and reply.turn_id == turn_id:
            reply.mark_played(played_ms)
            if reply.trace is not None:
                reply.trace.mark("playback_start", arrival_ns - int(played_ms * 1e6))
        held = self.held.pop(turn_id, None)
        if held is not None:
            held.mark("playback_start", arrival_ns - int(played_ms * 1e6))
            self.send_trace(held)

    def unplayed_after(self, turn_id: int, played_ms: float) -> float | None:
        """A reply sent whole (its task over, not stopped): what the client has yet to play once it played `played_ms`."""
        reply, task = self.current, self.task
        if reply is None or reply.turn_id != turn_id or reply.stopped or task is None or not task.done():
            return None
        return max(0.0, reply.sent_ms - played_ms)

    def interrupt(self, turn_id: int, t_ms: float | None) -> None:
        """Drop the reply's queued audio (the client is told to drop its own) and cancel it. `t_ms`: for speech
        that interrupts, the audio time at which it decided (sent with the clear)."""
        task, reply = self.task, self.current
        if t_ms is not None and reply is not None and reply.turn_id == turn_id and not reply.stopped and task is not None and task.done():
            # speech over a reply sent whole, still playing on the client: it drops the rest, the history keeps what
            # was heard; a reply its marks say has played to the end (speech in its echo tail) has nothing to drop
            if reply.played_ms is not None and reply.played_ms >= reply.sent_ms:
                return
            reply.stopped = True
            self.s.outbox.clear(turn_id, **({"t_ms": round(t_ms, 1)} if t_ms is not None else {}))
            if reply.played_ms is not None:
                with suppress(ValueError):
                    self.s.memory.truncate(turn_id, reply.played_ms, self.s.speak, PLAYED_SLACK_MS)
            return
        if task is None or task.done() or reply is None or reply.turn_id != turn_id or reply.stopped:
            return
        reply.stopped = True
        self.s.outbox.clear(reply.turn_id, **({"t_ms": round(t_ms, 1)} if t_ms is not None else {}))
        if reply.trace is not None:
            reply.trace.mark("interrupted")
        task.cancel()

    def release(self, a: ReleaseHold) -> None:
        """Speech held the reply and was no interruption: the client resumes playback where it paused."""
        self.s.outbox.send("response.resumed", turn_id=a.reply_turn, interjection=a.turn_id, t_ms=round(a.t_ms, 1),
                           reason=a.reason, heard=a.heard)  # fmt: skip
        reply = self.current
        if reply is not None and reply.turn_id == a.reply_turn and reply.trace is not None:
            reply.trace.info.setdefault("held", []).append({"by": a.turn_id, "reason": a.reason})

    def recent_words(self) -> list[str]:
        """The last words the replies said (the one running, and the one before): their echo is no interruption."""
        texts = [self._last_text, self.current.text if self.current is not None else ""]
        return words(" ".join(texts))[-RECENT_WORDS:]

    def announce(self, text: str) -> None:
        """Say `text` now, unasked (a timer's reminder): a reply of its own, kept in the history."""
        self.s.apply([replace(a, text=text, kind="announce") if isinstance(a, ReplyTo) else a for a in self.s.turns.greet()])

    def _client_call(self, turn_id: int, d: Delta) -> None:
        """A call of a client's tool as the model writes it: to the client (the Realtime API's function_call item),
        and once whole into the history, where the client's function_call_output will answer it."""
        if isinstance(d, CallStarted):
            self.s.outbox.send("tool.call.started", turn_id=turn_id, call_id=d.id, name=d.name)
        elif isinstance(d, ArgumentsDelta):
            self.s.outbox.send("tool.call.delta", turn_id=turn_id, index=d.index, arguments=d.text)
        elif isinstance(d, CallDone):
            self.s.memory.add("assistant", call_text(d.call))
            self.s.outbox.send("tool.call.done", turn_id=turn_id, call_id=d.call.id, name=d.call.name, arguments=d.call.arguments)

    def stop_current(self) -> None:
        if self.current is not None:
            self.interrupt(self.current.turn_id, None)

    async def finished(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the reply running now to end."""
        task = self.task
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=timeout_s)

    def close(self) -> None:
        """The session is closing: held traces whose timer never ran still reach the log."""
        for turn_id in list(self.held):
            self.send_trace(self.held.pop(turn_id))

    async def start(self, a: ReplyTo, trace: TurnTrace | None, utt: Utterance | None) -> None:
        s = self.s
        async with self._start_lock:  # at most one reply: the one before is stopped and waited for
            if s.turns.replying_to != a.turn_id:
                s.preempt.unused(a.turn_id)
                return  # a newer reply was asked for before this one could start
            task = self.task
            self.stop_current()  # told to stop when this reply was asked for, unless it had not started then
            if task is not None and not task.done():
                await asyncio.wait([task])
            if a.kind in ("greeting", "announce"):  # fixed words: the persona's greeting, a timer's reminder
                greeting = s.persona.greeting if a.kind == "greeting" else a.text
                if not greeting:
                    s.apply(s.turns.reply_ended(a.turn_id, interrupted=False))
                    return
                reply = self._reply_for(a.turn_id, None)
                if a.kind == "greeting":
                    reply.phrase_cache = s.stages.phrase_audio  # the same words in the same voice for every session
                self._launch(reply, _fixed(greeting), None)
                return
            assert a.text is not None and trace is not None
            joins = trace.info.get("joins")
            if a.kind == "continue":  # answer the history as it stands (a client's tool result ends it)
                messages = s.messages()
            else:
                messages = s.messages(a.text, joins)
            s.memory.drop_joined(joins)  # the early reply to half of this request goes
            dropped = s.memory.trim()  # only when a single typed turn outgrew it (or after a joined one)
            if dropped:
                trace.info["context"] = {"dropped_messages": dropped, "kept_messages": len(s.history)}
                messages = s.messages(a.text)
            if a.kind != "continue":
                s.memory.add_user(a.text, voice_turn=a.turn_id if a.kind == "voice" else None)
            trace.texts["user"] = a.text
            if utt is not None:
                utt.trace.info["ahead"] = utt.savings(trace.marks_ns["endpoint"])  # refined once the reply's reuse is known
            p = s.persona
            specs = session_tools(p, s.client_tools, s.client_tool_choice)
            choice = reply_choice(p, s.client_tools, s.client_tool_choice)
            if s.tools_unfit_ahead():  # (the tools changed since the pause: first_phrase did not see it)
                s.preempt.unused(a.turn_id)
            held = await s.preempt.take(a.turn_id, messages) if a.kind == "voice" else None
            trace.info.update(s.preempt.trace_info(a.turn_id, trace.marks_ns["endpoint"], held))
            call: list[LlmCall] = []  # the engine request, once the reply task has made it
            if specs:  # the reply may call a tool (voice.tool_turn); a phrase made ahead (no grammar) is continued
                trace.info["tools_offered"] = [t.name for t in specs]
                await s.stages.llm.warm_grammar()
                deltas = tool_reply(lambda m, c, ask, first: self._llm_deltas(m, trace, utt if first else None, call, held if first else None,
                                                                              c, CALL_TOKENS if ask.choice not in ("auto", "none") else 0, ask),
                                    messages, p.toolbox, specs, choice, p.tool_filler, self.timers, trace,
                                    lambda d: self._client_call(a.turn_id, d))  # fmt: skip
            else:
                deltas = self._llm_deltas(messages, trace, utt, call, held)
            reply = self._reply_for(a.turn_id, trace)
            if held is not None:
                reply.phrase_cache = held.audio  # the first phrase's audio, made in the pause
            self._launch(reply, deltas, trace, lambda on: call and call[0].hold(on))

    def _reply_for(self, turn_id: int, trace: TurnTrace | None) -> Reply:
        s = self.s
        binding = s.stages.voices[s.voice_name] if s.speak else None
        echo = s.echo
        rate = s.settings.output_sample_rate
        tap = None if echo is None else lambda turn, audio: echo.sent(turn, resample(audio, rate, SAMPLE_RATE))
        return Reply(
            turn_id, s.outbox, binding, s.persona.speaking_rate, rate,
            trace, s.stages.tts_work, s.settings.audio_lead_ms, s.stages.runner, s.session_id, tap=tap,
        )  # fmt: skip

    def _launch(
        self, reply: Reply, deltas: AsyncIterator[str], trace: TurnTrace | None, hold: Callable[[bool], None] = lambda on: None
    ) -> None:
        tg = self.s.task_group
        assert tg is not None, "session is not running"
        if self.current is not None:
            self._last_text = self.current.text
        self.current = reply
        self.s.summary.reply_started()  # a summary being written waits for the reply
        self.task = tg.create_task(self._respond(reply, deltas, trace, hold))

    async def _respond(self, reply: Reply, deltas: AsyncIterator[str], trace: TurnTrace | None, hold: Callable[[bool], None]) -> None:
        interrupted = True  # unless the reply runs to its end
        try:
            await reply.run(deltas, hold)
            interrupted = False
        except* (LlmFailed, OSError, RuntimeError, ValueError) as group:  # a stage failed: this reply ends, the session lives
            log.warning("session %s turn %d failed: %r", self.s.session_id, reply.turn_id, group.exceptions)
            if trace is not None:
                trace.info["error"] = f"{type(group.exceptions[0]).__name__}: {group.exceptions[0]}"
            self.s.outbox.send("error", code="reply_failed", message=str(group.exceptions[0]), fatal=False)
        finally:
            self._finish(reply, trace, interrupted)

    def _finish(self, reply: Reply, trace: TurnTrace | None, interrupted: bool) -> None:
        s = self.s
        spoken, content = reply_content(reply, interrupted)
        if content:
            s.memory.add_reply(reply, content, interrupted)
        llm = trace.info.get("llm") if trace is not None else None  # the engine's counts, once its finish came
        usage = None if llm is None else {"input_tokens": llm["prefill_tokens"] + llm["reused_tokens"],
                                          "cached_tokens": llm["reused_tokens"], "output_tokens": llm["decode_tokens"]}  # fmt: skip
        s.outbox.send("response.done", turn_id=reply.turn_id, text=reply.text, interrupted=interrupted, spoken_text=spoken,
                      usage=usage)  # fmt: skip
        s.reply_done(reply.turn_id)
        # now, so the shorter prompt is back in the cache before the next turn; at once if the engine had to leave
        # messages out (more tokens than the character budget foresaw: its cut moves every turn, and every turn would
        # prefill the whole prompt again)
        fitted = trace is not None and bool((trace.info.get("llm") or {}).get("dropped_messages"))
        context: dict[str, Any] = {}
        if (summary := s.summary.take_ready()) is not None:  # written ahead: the oldest turns give way to it
            context.update(summarised_messages=s.summary.apply(summary), summary=summary.text)
        # the bound came before a summary was ready (with one on its way, a little past it), or a forced halving
        if dropped := s.memory.trim(force=fitted, slack=SLACK if s.summary.underway else 1.0):
            context["dropped_messages"] = dropped
        if context:
            if trace is not None:
                trace.info["context"] = {**context, "kept_messages": len(s.history)}
            if s.settings.warm_prompt:
                with suppress(RuntimeError):  # the task group is shutting down: the session is closing
                    s.rewarm()
        s.summary.go_on()
        said = trace.texts.get("user") if trace is not None else None
        if said and s.persona.memory:  # what the user said of themselves, for their next conversations
            s.user_memory.turn_ended(said)
        # a reply sent whole still plays on the client: speech over its last words (or their echo) is an interjection
        s.apply(s.turns.reply_ended(reply.turn_id, interrupted, audible_ms=0.0 if interrupted else reply.unplayed_ms()))
        if trace is not None:
            trace.texts["reply"] = reply.text
            trace.mark("interrupted" if interrupted else "done")
            if interrupted or trace.has("playback_start") or not trace.has("first_audio_sent") or not self._hold(trace):
                self.send_trace(trace)

    def _hold(self, trace: TurnTrace) -> bool:
        """Keep a finished trace until the client's first playback mark or TRACE_HOLD_S; False if it cannot wait."""
        if self.s.task_group is None:
            return False
        self.held[trace.turn_id] = trace
        try:
            self.s.spawn(self._release_held, trace.turn_id)
        except RuntimeError:  # the task group is shutting down: the session is closing
            self.held.pop(trace.turn_id)
            return False
        return True

    async def _release_held(self, turn_id: int) -> None:
        try:
            await asyncio.sleep(TRACE_HOLD_S)
        finally:  # also when the session closes: the trace still reaches the log
            trace = self.held.pop(turn_id, None)
            if trace is not None:
                self.send_trace(trace)

    def send_trace(self, trace: TurnTrace) -> None:
        self.s.outbox.send("turn.trace", **trace.to_dict())
        self.s.on_trace(trace)

    async def _llm_deltas(
        self, messages: Sequence[tuple[str, str] | ChatMessage], trace: TurnTrace, utt: Utterance | None, call: list[LlmCall],
        held: HeldPhrase | None = None, constraint: Constraint | None = None, extra_tokens: int = 0, tools: ToolAsk | None = None,
    ) -> AsyncIterator[str]:
        """The reply's text: from its own engine request, or from the one made ahead (`held`), continued."""
        s = self.s
        persona = s.persona
        llm_start_ns = trace.mark("llm_start")
        replay: AsyncIterator[LlmEvent]
        if held is not None and held.call is not None:  # (made without a grammar: a call in it is parsed as written)
            events, replay = held.call, held.replay()
        else:
            more: dict[str, Any] = {} if constraint is None else {"constraint": constraint}
            if tools is not None:
                more["tools"] = tools
            events = s.stages.llm.generate(s.session_id, messages, max_new_tokens=persona.max_reply_tokens + extra_tokens,
                                           temperature=persona.temperature, **more)  # fmt: skip
            replay = events
        call[:] = [events]  # (a tool turn's later request replaces the first: hold() pauses the one running)
        async with aclosing(events):
            async for event in replay:
                if isinstance(event, LlmToken):
                    trace.mark("llm_first_token")
                    yield event.text
                elif isinstance(event, LlmFinish):
                    trace.info["llm"] = {
                        "finish": event.reason, "prefill_tokens": event.prefill_tokens, "reused_tokens": event.reused_tokens,
                        "decode_tokens": event.decode_tokens, "queue_ms": round(event.queue_ms, 3),
                        "generate_ms": round((now_ns() - llm_start_ns) / 1e6, 3),  # the request's start to its finish
                        # this reply's prompt tokens that came from another session's cache (copied by the
                        # reply itself, or by the session's warm-up before it)
                        "shared_prefix_tokens": event.shared_prefix_tokens + self.warm_shared,
                        **({"dropped_messages": event.dropped_messages} if event.dropped_messages else {}),
                    }  # fmt: skip
                    self.warm_shared = 0
                    if utt is not None:
                        trace.info["ahead"] = utt.savings(trace.marks_ns["endpoint"], llm_start_ns, event)
                elif isinstance(event, LlmError):
                    raise LlmFailed(event.message)


async def _fixed(text: str) -> AsyncIterator[str]:
    yield text
