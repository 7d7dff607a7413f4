"""One conversation per connection (DESIGN.md section 5): persona, history, at most one reply, barge-in, traces.

The socket layer feeds it 16 kHz audio and typed commands; its Listener hears the user, and it speaks through
an Outbox. Knows nothing of sockets, JSON or config files (web/ builds its settings and stages).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.asr import Transcriber
from voice.listen import Utterance
from voice.listener import SAMPLE_RATE, Listener, Overloaded
from voice.llm_bridge import LlmBridge, LlmError, LlmFinish, LlmToken
from voice.outbox import Outbox
from voice.trace import TurnTrace
from voice.turn import PersonaSpec, Reply, VoiceBinding, WorkCounter
from voice.vad import Vad

__all__ = ["SAMPLE_RATE", "InputError", "SessionSettings", "Stages", "Session", "LlmFailed"]
log = logging.getLogger(__name__)

# A reply whose audio was sent holds its turn.trace this long for the client's first playback.mark, so
# the trace carries playback_start even when the whole reply was sent before the client began playing.
TRACE_HOLD_S = 1.0


class InputError(Exception):
    """A command the session refuses (unknown persona, overloaded): becomes a non-fatal `error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LlmFailed(RuntimeError):
    """The engine reported an error for this request."""


@dataclass(frozen=True)
class SessionSettings:
    vad_threshold: float = 0.5
    min_speech_ms: float = 120.0
    hangover_ms: float = 500.0
    barge_in_min_speech_ms: float = 200.0
    partial_interval_ms: int = 500
    budgets_ms: Mapping[str, float] = field(default_factory=dict)
    output_sample_rate: int = 22050
    audio_lead_ms: float = 1000.0
    greet: bool = True  # speak the persona's greeting at start and on a persona switch


@dataclass(frozen=True)
class Stages:
    """The loaded models a session uses; built once per server and shared by all sessions."""

    make_vad: Callable[[], Vad]  # VADs keep per-stream state: one per session
    transcriber: Transcriber
    llm: LlmBridge
    voices: Mapping[str, VoiceBinding]
    tts_work: WorkCounter = field(default_factory=WorkCounter)


class Session:
    def __init__(
        self,
        session_id: str,
        stages: Stages,
        settings: SessionSettings,
        personas: Mapping[str, PersonaSpec],
        persona: str,
        voice: str | None = None,
        *,
        outbox: Outbox | None = None,
        on_trace: Callable[[TurnTrace], None] = lambda trace: None,
    ) -> None:
        self.session_id = session_id
        self.stages = stages
        self.settings = settings
        self.personas = personas
        self.outbox = outbox or Outbox()
        self.on_trace = on_trace
        self.persona_name, self.voice_override = self._check(persona, voice)
        self.history: list[tuple[str, str]] = []  # (role, content), what the user said and heard
        s = settings
        self.listener = Listener(
            self, stages.make_vad, stages.transcriber, stages.llm, vad_threshold=s.vad_threshold,
            min_speech_ms=s.min_speech_ms, hangover_ms=s.hangover_ms, barge_in_min_speech_ms=s.barge_in_min_speech_ms,
            partial_interval_ms=s.partial_interval_ms,
        )  # fmt: skip
        self._next_turn = 1
        self._reply: Reply | None = None
        self._reply_task: asyncio.Task[None] | None = None
        self._played_ms: dict[int, float] = {}
        self._interrupted: dict[int, tuple[Reply, int]] = {}  # turn -> (reply, history index) for late marks
        self._held: dict[int, TurnTrace] = {}  # finished turns' traces waiting for their first playback mark
        self._bg: set[asyncio.Task[Any]] = set()
        self._start_lock = asyncio.Lock()
        self._tg: asyncio.TaskGroup | None = None
        self._early: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []

    @property
    def state(self) -> str:
        """listening (the user speaks) | responding (a reply runs) | idle."""
        if self.listener.utt is not None:
            return "listening"
        return "responding" if self.replying() else "idle"

    # -- who speaks ----------------------------------------------------------------------------

    @property
    def persona(self) -> PersonaSpec:
        return self.personas[self.persona_name]

    @property
    def voice_name(self) -> str:
        return self.voice_override or self.persona.voice

    def _check(self, persona: str | None, voice: str | None) -> tuple[str, str | None]:
        name = persona or getattr(self, "persona_name", None) or next(iter(self.personas))
        if name not in self.personas:
            raise InputError("unknown_persona", f"unknown persona {name!r} (known: {', '.join(self.personas)})")
        if voice is not None and voice not in self.stages.voices:
            raise InputError("unknown_voice", f"unknown voice {voice!r} (known: {', '.join(self.stages.voices)})")
        return name, voice

    def update(self, persona: str | None = None, voice: str | None = None) -> None:
        """Switch persona and/or voice; takes effect from the next reply. A new persona drops a voice override
        and greets in its own voice, ending a reply still speaking first (as a barge-in would)."""
        name, checked_voice = self._check(persona, voice)
        if persona is not None and voice is None:
            checked_voice = None
        elif voice is None:
            checked_voice = self.voice_override
        switched = name != self.persona_name
        self.persona_name, self.voice_override = name, checked_voice
        if switched and self.persona.greeting and self.settings.greet:
            self.spawn(self._greet_again, name)

    # -- inputs from the socket layer ------------------------------------------------------------

    def push_audio(self, samples: np.ndarray, arrival_ns: int) -> None:
        """16 kHz float32 [N] as it arrived; `arrival_ns` is perf_counter_ns at receipt."""
        try:
            self.listener.push(samples, arrival_ns)
        except Overloaded:
            raise InputError("overloaded", "audio is arriving faster than it can be processed; dropped") from None

    def text_input(self, text: str) -> int:
        """A typed user turn: skips VAD and ASR. Returns its turn id."""
        turn_id = self.new_turn()
        trace = self.new_trace(turn_id, "text")
        trace.mark("endpoint")
        self.spawn(self._start_reply, turn_id, text, trace)
        return turn_id

    def cancel_reply(self) -> None:
        self.interrupt()

    def playback_mark(self, turn_id: int, played_ms: float, arrival_ns: int) -> None:
        self._played_ms[turn_id] = played_ms
        reply = self._reply
        if reply is not None and reply.turn_id == turn_id and reply.trace is not None:
            reply.trace.mark("playback_start", arrival_ns - int(played_ms * 1e6))
        held = self._held.pop(turn_id, None)
        if held is not None:
            held.mark("playback_start", arrival_ns - int(played_ms * 1e6))
            self._send_trace(held)
        if turn_id in self._interrupted:  # the client reports how far it got after the clear: history follows
            old, index = self._interrupted[turn_id]
            if index < len(self.history) and self.history[index][0] == "assistant":
                self.history[index] = ("assistant", old.spoken(played_ms))

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Listen until cancelled; replies run beside the listen loop in the same task group."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            greeting = self.persona.greeting
            if greeting and self.settings.greet:
                self._launch(self._reply_for(self.new_turn(), None), self._fixed(greeting), None)
            early, self._early = self._early, []
            for fn, args in early:
                self.spawn(fn, *args)
            await self.listener.run()

    async def close(self) -> None:
        """Stop everything this session started, wait for it, and free its engine slot."""
        self.interrupt()
        self._early.clear()
        tasks = [t for t in [*self._bg, self._reply_task] if t is not None]
        for task in tasks:
            task.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        for turn_id in list(self._held):  # held traces whose timer never ran still reach the log
            self._send_trace(self._held.pop(turn_id))
        await asyncio.to_thread(self.stages.llm.release, self.session_id)

    def replying(self) -> bool:
        return self._reply_task is not None and not self._reply_task.done()

    # -- what the listener calls ------------------------------------------------------------------

    def new_turn(self) -> int:
        turn_id, self._next_turn = self._next_turn, self._next_turn + 1
        return turn_id

    def new_trace(self, turn_id: int, kind: str) -> TurnTrace:
        trace = TurnTrace(turn_id, self.session_id, dict(self.settings.budgets_ms))
        trace.info.update(input=kind, persona=self.persona_name, voice=self.voice_name)
        return trace

    def messages(self, user_text: str | None = None) -> list[tuple[str, str]]:
        msgs = [("system", self.persona.system_prompt), *self.history]
        if user_text is not None:
            msgs.append(("user", user_text))
        return msgs

    async def user_turn(self, utt: Utterance) -> None:
        """A heard turn with its final transcript: reply to it."""
        endpoint_ns = utt.trace.marks_ns["endpoint"]
        utt.trace.info["ahead"] = utt.savings(endpoint_ns)  # refined once the reply's cache reuse is known
        await self._start_reply(utt.turn_id, utt.final_text, utt.trace, utt)

    def interrupt(self, t_ms: float | None = None) -> None:
        """Barge-in or cancel: drop queued audio (the client is told to drop its own) and cancel the reply.
        `t_ms`: for a barge-in, the audio time at which the user's speech decided it (sent with the clear)."""
        task, reply = self._reply_task, self._reply
        if task is None or task.done() or reply is None:
            return
        self.outbox.clear(reply.turn_id, **({"t_ms": round(t_ms, 1)} if t_ms is not None else {}))
        if reply.trace is not None:
            reply.trace.mark("interrupted")
        task.cancel()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Task[Any] | None:
        """Run `fn(*args)` as background work of this session. The coroutine is made inside the task, so a
        task cancelled before it starts leaves no coroutine behind un-awaited."""
        if self._tg is None:  # a command that came before run() got going: started by run()
            self._early.append((fn, args))
            return None
        task = self._tg.create_task(self._guard(fn, args))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    async def _guard(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        """Background work (partials, recognition, turn start) fails alone, with an error to the client."""
        try:
            await fn(*args)
        except (LlmFailed, OSError, RuntimeError, ValueError) as exc:
            log.warning("session %s: %r", self.session_id, exc)
            self.outbox.send("error", code="stage_failed", message=str(exc), fatal=False)

    # -- replying ---------------------------------------------------------------------------------------

    async def _greet_again(self, persona: str) -> None:
        async with self._start_lock:
            await self._stop_reply()
            greeting = self.personas[persona].greeting
            if greeting and persona == self.persona_name:  # not switched away again meanwhile
                self._launch(self._reply_for(self.new_turn(), None), self._fixed(greeting), None)

    async def _start_reply(self, turn_id: int, user_text: str, trace: TurnTrace, utt: Utterance | None = None) -> None:
        async with self._start_lock:  # at most one reply: a new turn ends the one still speaking
            await self._stop_reply()
            messages = self.messages(user_text)
            self.history.append(("user", user_text))
            self._launch(self._reply_for(turn_id, trace), self._llm_deltas(messages, trace, utt), trace)

    def _reply_for(self, turn_id: int, trace: TurnTrace | None) -> Reply:
        binding = self.stages.voices[self.voice_name]
        return Reply(
            turn_id, self.outbox, binding, self.persona.speaking_rate, self.settings.output_sample_rate,
            trace, self.stages.tts_work, self.settings.audio_lead_ms,
        )  # fmt: skip

    def _launch(self, reply: Reply, deltas: AsyncIterator[str], trace: TurnTrace | None) -> None:
        assert self._tg is not None, "session is not running"
        self._reply = reply
        self._reply_task = self._tg.create_task(self._respond(reply, deltas, trace))

    async def _respond(self, reply: Reply, deltas: AsyncIterator[str], trace: TurnTrace | None) -> None:
        interrupted = True  # unless the reply runs to its end
        try:
            await reply.run(deltas)
            interrupted = False
        except* (LlmFailed, OSError, RuntimeError, ValueError) as group:  # a stage failed: this reply ends, the session lives
            log.warning("session %s turn %d failed: %r", self.session_id, reply.turn_id, group.exceptions)
            self.outbox.send("error", code="reply_failed", message=str(group.exceptions[0]), fatal=False)
        finally:
            self._finish_reply(reply, trace, interrupted)

    def _finish_reply(self, reply: Reply, trace: TurnTrace | None, interrupted: bool) -> None:
        spoken = reply.spoken(self._played_ms.get(reply.turn_id) if interrupted else float("inf"))
        content = spoken if interrupted else reply.text.strip()
        if content:
            self.history.append(("assistant", content))
            if interrupted:
                self._interrupted = {reply.turn_id: (reply, len(self.history) - 1)}
        self.outbox.send("response.done", turn_id=reply.turn_id, text=reply.text, interrupted=interrupted, spoken_text=spoken)
        if self._reply is reply:
            self._reply = None
        if trace is not None:
            trace.mark("interrupted" if interrupted else "done")
            if interrupted or trace.has("playback_start") or not trace.has("first_audio_sent") or not self._hold(trace):
                self._send_trace(trace)

    def _hold(self, trace: TurnTrace) -> bool:
        """Keep a finished trace until the client's first playback mark or TRACE_HOLD_S; False if it cannot wait."""
        if self._tg is None:
            return False
        self._held[trace.turn_id] = trace
        try:
            self.spawn(self._release_held, trace.turn_id)
        except RuntimeError:  # the task group is shutting down: the session is closing
            self._held.pop(trace.turn_id)
            return False
        return True

    async def _release_held(self, turn_id: int) -> None:
        try:
            await asyncio.sleep(TRACE_HOLD_S)
        finally:  # also when the session closes: the trace still reaches the log
            trace = self._held.pop(turn_id, None)
            if trace is not None:
                self._send_trace(trace)

    def _send_trace(self, trace: TurnTrace) -> None:
        self.outbox.send("turn.trace", **trace.to_dict())
        self.on_trace(trace)

    async def _llm_deltas(self, messages: list[tuple[str, str]], trace: TurnTrace, utt: Utterance | None) -> AsyncIterator[str]:
        persona = self.persona
        llm_start_ns = trace.mark("llm_start")
        events = self.stages.llm.generate(
            self.session_id, messages, max_new_tokens=persona.max_reply_tokens, temperature=persona.temperature
        )
        async with aclosing(events):
            async for event in events:
                if isinstance(event, LlmToken):
                    trace.mark("llm_first_token")
                    yield event.text
                elif isinstance(event, LlmFinish):
                    trace.info["llm"] = {
                        "finish": event.reason, "prefill_tokens": event.prefill_tokens, "reused_tokens": event.reused_tokens,
                        "decode_tokens": event.decode_tokens, "queue_ms": round(event.queue_ms, 3),
                    }  # fmt: skip
                    if utt is not None:
                        trace.info["ahead"] = utt.savings(trace.marks_ns["endpoint"], llm_start_ns, event)
                elif isinstance(event, LlmError):
                    raise LlmFailed(event.message)

    @staticmethod
    async def _fixed(text: str) -> AsyncIterator[str]:
        yield text

    async def _stop_reply(self) -> None:
        task = self._reply_task
        self.interrupt()
        if task is not None and not task.done():
            await asyncio.wait([task])
