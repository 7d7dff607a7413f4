"""One conversation per connection (DESIGN.md section 5): listen loop, at most one reply, barge-in, traces.

The socket layer feeds it 16 kHz audio and typed commands; it speaks through an Outbox. Knows nothing of
sockets, JSON or config files (web/ builds its settings and stages).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.asr import StreamingTranscriber, Transcriber
from voice.audio import Framer
from voice.endpointer import Endpointer, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted
from voice.listen import Utterance
from voice.llm_bridge import LlmBridge, LlmError, LlmFinish, LlmToken
from voice.outbox import Outbox
from voice.trace import TurnTrace, now_ns
from voice.turn import PersonaSpec, Reply, VoiceBinding, WorkCounter
from voice.vad import Vad

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000  # what VAD and ASR take; the socket layer resamples other client rates
PREROLL_PAD_MS = 100.0  # audio kept before the qualifying voiced run, so the first word is not clipped
AUDIO_QUEUE_ITEMS = 500  # 10 s of 20 ms messages: a listen loop this far behind is broken, not slow


class InputError(Exception):
    """A command the session refuses (unknown persona, overloaded): becomes a non-fatal `error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SessionSettings:
    vad_threshold: float = 0.5
    min_speech_ms: float = 120.0
    hangover_ms: float = 500.0
    barge_in_min_speech_ms: float = 300.0
    partial_interval_ms: int = 500
    budgets_ms: Mapping[str, float] = field(default_factory=dict)
    output_sample_rate: int = 22050
    audio_lead_ms: float = 1000.0
    greet: bool = True


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
        self.state = "idle"  # idle | listening | responding
        self._audio_q: asyncio.Queue[tuple[np.ndarray, int]] = asyncio.Queue(AUDIO_QUEUE_ITEMS)
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=3000)  # (audio ms of message start, arrival ns)
        self._audio_in_ms = 0.0
        self._next_turn = 1
        self._utt: Utterance | None = None
        self._reply: Reply | None = None
        self._reply_task: asyncio.Task[None] | None = None
        self._played_ms: dict[int, float] = {}
        self._interrupted: dict[int, tuple[Reply, int]] = {}  # turn -> (reply, history index) for late marks
        self._bg: set[asyncio.Task[Any]] = set()
        self._start_lock = asyncio.Lock()
        self._tg: asyncio.TaskGroup | None = None
        self._early: list[Coroutine[Any, Any, Any]] = []

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
        """Switch persona and/or voice; takes effect from the next reply. A new persona drops a voice override."""
        name, checked_voice = self._check(persona, voice)
        if persona is not None and voice is None:
            checked_voice = None
        elif voice is None:
            checked_voice = self.voice_override
        self.persona_name, self.voice_override = name, checked_voice

    # -- inputs from the socket layer ------------------------------------------------------------

    def push_audio(self, samples: np.ndarray, arrival_ns: int) -> None:
        """16 kHz float32 [N] as it arrived; `arrival_ns` is perf_counter_ns at receipt."""
        try:
            self._audio_q.put_nowait((samples, arrival_ns))
        except asyncio.QueueFull:
            raise InputError("overloaded", "audio is arriving faster than it can be processed; dropped") from None

    def text_input(self, text: str) -> int:
        """A typed user turn: skips VAD and ASR. Returns its turn id."""
        turn_id = self._new_turn()
        trace = self._new_trace(turn_id, "text")
        trace.mark("endpoint")
        self._spawn(self._start_reply(turn_id, text, trace))
        return turn_id

    def cancel_reply(self) -> None:
        self._interrupt()

    def playback_mark(self, turn_id: int, played_ms: float, arrival_ns: int) -> None:
        self._played_ms[turn_id] = played_ms
        reply = self._reply
        if reply is not None and reply.turn_id == turn_id and reply.trace is not None:
            reply.trace.mark("playback_start", arrival_ns - int(played_ms * 1e6))
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
                turn_id = self._new_turn()
                self._launch(self._reply_for(turn_id, None), self._fixed(greeting), None)
            for coro in self._early:
                self._spawn(coro)
            self._early.clear()
            await self._listen()

    async def close(self) -> None:
        """Stop everything this session started and free its engine slot."""
        self._interrupt()
        for coro in self._early:
            coro.close()
        self._early.clear()
        for task in [*self._bg, *([self._reply_task] if self._reply_task else [])]:
            task.cancel()
        pending = [t for t in [*self._bg, self._reply_task] if t is not None and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        await asyncio.to_thread(self.stages.llm.release, self.session_id)

    def replying(self) -> bool:
        return self._reply_task is not None and not self._reply_task.done()

    # -- listening ----------------------------------------------------------------------------------

    def _new_vad(self) -> Vad:
        """Build and warm this session's VAD (a TorchScript model's first calls are slow) off the loop;
        audio arriving meanwhile waits in the queue and is processed in order, with its arrival times."""
        vad = self.stages.make_vad()
        silent = np.zeros(int(SAMPLE_RATE * vad.frame_ms / 1000), dtype=np.float32)
        for _ in range(3):
            vad.speech_prob(silent)
        vad.reset()
        return vad

    async def _listen(self) -> None:
        vad = await asyncio.to_thread(self._new_vad)
        s = self.settings
        framer = Framer(SAMPLE_RATE, vad.frame_ms)
        endpointer = Endpointer.for_vad(vad, s.vad_threshold, s.min_speech_ms, s.hangover_ms)
        preroll: deque[np.ndarray] = deque(maxlen=max(1, int((s.min_speech_ms + PREROLL_PAD_MS) / vad.frame_ms) + 1))
        while True:
            samples, arrival_ns = await self._audio_q.get()
            self._arrivals.append((self._audio_in_ms, arrival_ns))
            self._audio_in_ms += 1000.0 * len(samples) / SAMPLE_RATE
            for frame in framer.push(samples):
                for event in endpointer.push(vad.speech_prob(frame.samples), frame.t_ms):
                    self._on_vad(event, preroll)
                utt = self._utt
                if utt is None:
                    preroll.append(frame.samples)
                    continue
                utt.feed(frame.samples)
                if not utt.paused:
                    self._maybe_partial(utt)
                    voiced_ms = frame.end_ms - utt.start_ms
                    if utt.during_reply and not utt.barged and voiced_ms >= s.barge_in_min_speech_ms:
                        utt.barged = True
                        self._interrupt(t_ms=frame.end_ms)

    def _on_vad(self, event: object, preroll: deque[np.ndarray]) -> None:
        if isinstance(event, SpeechStarted):
            turn_id = self._new_turn()
            trace = self._new_trace(turn_id, "voice")
            trace.mark("speech_start", self._arrival_ns(event.t_ms))
            stt = StreamingTranscriber(self.stages.transcriber, self.settings.partial_interval_ms)
            for samples in preroll:
                stt.append(samples)
            preroll.clear()
            self._utt = Utterance(turn_id, trace, event.t_ms, stt, during_reply=self.replying())
            self.state = "listening"
            self.outbox.send("vad.speech_started", t_ms=round(event.t_ms, 1))
        elif isinstance(event, SpeechPaused) and self._utt is not None:
            utt = self._utt
            utt.pause()
            if not utt.during_reply or utt.barged:
                utt.ahead = self._spawn(self._ahead(utt))
        elif isinstance(event, SpeechResumed) and self._utt is not None:
            self._utt.resume()
        elif isinstance(event, SpeechEnded) and self._utt is not None:
            utt, self._utt = self._utt, None
            # the last voiced sample lies just before t_ms; the message that carried it arrived at:
            utt.trace.mark("speech_end", self._arrival_ns(event.t_ms - 0.001))
            utt.trace.mark("endpoint")
            self.outbox.send("vad.speech_ended", t_ms=round(event.t_ms, 1))
            self.state = "responding" if self.replying() else "idle"
            if utt.during_reply and not utt.barged:  # a backchannel or cough under the reply: not a turn
                utt.discard()
                return
            self._spawn(self._finish_utterance(utt))

    def _maybe_partial(self, utt: Utterance) -> None:
        if utt.partial_task is None or utt.partial_task.done():
            if utt.stt.partial_due():
                utt.partial_task = self._spawn(self._partial(utt))

    async def _partial(self, utt: Utterance) -> None:
        text = await utt.stt.partial()
        if text is not None and utt is self._utt:
            self.outbox.send("transcript.partial", turn_id=utt.turn_id, text=text)

    async def _ahead(self, utt: Utterance) -> None:
        """During the hangover: final recognition, then an engine prefill of the turn as it would be sent."""
        utt.ahead_start_ns = now_ns()
        transcript = await utt.stt.final()
        utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
        utt.final_event.set()
        if utt.final_text and not self.replying():
            utt.prefill_start_ns = now_ns()
            utt.prefill_history_len = len(self.history)
            result = await self.stages.llm.prefill(self.session_id, self._messages(utt.final_text))
            if isinstance(result, LlmFinish):
                utt.prefill_done_ns = now_ns()

    async def _finish_utterance(self, utt: Utterance) -> None:
        trace = utt.trace
        if utt.ahead is not None:
            await utt.final_ready()  # recognition that ran during the hangover
        if utt.final_ns is None:  # no ahead work (or it was discarded): recognise now
            transcript = await utt.stt.final()
            utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
        trace.mark("asr_final", utt.final_ns)
        self.outbox.send("transcript.final", turn_id=utt.turn_id, text=utt.final_text)
        if not utt.final_text:
            utt.discard()
            return
        if utt.ahead is not None:
            await asyncio.wait([utt.ahead])  # a prefill still running would only be repeated by the real request
        trace.info["ahead"] = utt.savings(trace.marks_ns["endpoint"], len(self.history))
        await self._start_reply(utt.turn_id, utt.final_text, trace)

    # -- replying ---------------------------------------------------------------------------------------

    def _messages(self, user_text: str | None = None) -> list[tuple[str, str]]:
        msgs = [("system", self.persona.system_prompt), *self.history]
        if user_text is not None:
            msgs.append(("user", user_text))
        return msgs

    async def _start_reply(self, turn_id: int, user_text: str, trace: TurnTrace) -> None:
        async with self._start_lock:  # at most one reply: a new turn ends the one still speaking
            await self._stop_reply()
            messages = self._messages(user_text)
            self.history.append(("user", user_text))
            self._launch(self._reply_for(turn_id, trace), self._llm_deltas(messages, trace), trace)

    def _reply_for(self, turn_id: int, trace: TurnTrace | None) -> Reply:
        binding = self.stages.voices[self.voice_name]
        return Reply(
            turn_id, self.outbox, binding, self.persona.speaking_rate, self.settings.output_sample_rate,
            trace, self.stages.tts_work, self.settings.audio_lead_ms,
        )  # fmt: skip

    def _launch(self, reply: Reply, deltas: AsyncIterator[str], trace: TurnTrace | None) -> None:
        assert self._tg is not None, "session is not running"
        self._reply = reply
        self.state = "responding"
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
            self.state = "listening" if self._utt is not None else "idle"
        if trace is not None:
            trace.mark("interrupted" if interrupted else "done")
            self.outbox.send("turn.trace", **trace.to_dict())
            self.on_trace(trace)

    async def _llm_deltas(self, messages: list[tuple[str, str]], trace: TurnTrace) -> AsyncIterator[str]:
        persona = self.persona
        trace.mark("llm_start")
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
                        "finish": event.reason, "prefill_tokens": event.prefill_tokens,
                        "reused_tokens": event.reused_tokens, "decode_tokens": event.decode_tokens,
                    }  # fmt: skip
                elif isinstance(event, LlmError):
                    raise LlmFailed(event.message)

    @staticmethod
    async def _fixed(text: str) -> AsyncIterator[str]:
        yield text

    def _interrupt(self, t_ms: float | None = None) -> None:
        """Barge-in or cancel: drop queued audio (the client is told to drop its own) and cancel the reply.
        `t_ms`: for a barge-in, the audio time at which the user's speech decided it (sent with the clear)."""
        task, reply = self._reply_task, self._reply
        if task is None or task.done() or reply is None:
            return
        self.outbox.clear(reply.turn_id, **({"t_ms": round(t_ms, 1)} if t_ms is not None else {}))
        if reply.trace is not None:
            reply.trace.mark("interrupted")
        task.cancel()

    async def _stop_reply(self) -> None:
        task = self._reply_task
        self._interrupt()
        if task is not None and not task.done():
            await asyncio.wait([task])

    # -- helpers ----------------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        if self._tg is None:  # a command that came before run() got going: started by run()
            self._early.append(coro)
            return None
        task = self._tg.create_task(self._guard(coro))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    async def _guard(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Background work (partials, recognition, turn start) fails alone, with an error to the client."""
        try:
            await coro
        except (LlmFailed, OSError, RuntimeError, ValueError) as exc:
            log.warning("session %s: %r", self.session_id, exc)
            self.outbox.send("error", code="stage_failed", message=str(exc), fatal=False)

    def _new_turn(self) -> int:
        turn_id, self._next_turn = self._next_turn, self._next_turn + 1
        return turn_id

    def _new_trace(self, turn_id: int, kind: str) -> TurnTrace:
        trace = TurnTrace(turn_id, self.session_id, dict(self.settings.budgets_ms))
        trace.info.update(input=kind, persona=self.persona_name, voice=self.voice_name)
        return trace

    def _arrival_ns(self, t_ms: float) -> int:
        """Arrival time of the client message holding audio time `t_ms` (the latest one starting at or before it)."""
        for start_ms, arrival_ns in reversed(self._arrivals):
            if start_ms <= t_ms:
                return arrival_ns
        return self._arrivals[0][1] if self._arrivals else now_ns()


class LlmFailed(RuntimeError):
    """The engine reported an error for this request."""
