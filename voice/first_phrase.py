"""Runs the preemptive first phrase (voice.preemption decides): in the user's pause, the reply's own engine request
decoded up to its first phrase and then held, that phrase synthesised below every committed turn's work; at the
endpoint the reply continues that same request (same tokens, same sampling state) and speaks the held audio at once.

Shed when the machine is busy, so preemption never costs anyone else. Counts the work it threw away. Knows nothing of
the wire; the session calls in (follow, after_ahead, no_reply, take, close), the replies take what is held.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from llm_engine.tool_calls import opens_call
from voice.audio import resample
from voice.chunker import PhraseChunker
from voice.llm_bridge import LlmCall, LlmError, LlmEvent, LlmFinish, LlmToken
from voice.phrase_audio import PhraseAudioCache
from voice.preemption import DropPhrase, PreAction, Preemption, ShedPhrase, StartPhrase, UsePhrase
from voice.stage_queue import Priority
from voice.trace import now_ns
from voice.tts_stream import synthesize_async
from voice.turntaking import Action

if TYPE_CHECKING:
    from voice.listener import Utterance
    from voice.stages import PersonaSpec, SessionSettings, Stages

log = logging.getLogger(__name__)


@dataclass
class HeldPhrase:
    """The reply's engine request, read up to its first phrase and held, and that phrase's audio."""

    turn_id: int
    messages: list[tuple[str, str]]
    voice: tuple[str, bool]  # (voice name, spoken): the reply's must be the same for the audio to be its own
    call: LlmCall | None = None
    events: list[LlmEvent] = field(default_factory=list)  # read so far, replayed to the reply first
    phrase: str | None = None
    audio: PhraseAudioCache | None = None  # the phrase's audio, keyed as the reply's synthesis looks it up
    tts_ms: float = 0.0  # synthesis time spent on it (finished syntheses)
    tts_start_s: float | None = None  # a synthesis running since then
    task: asyncio.Task[Any] | None = None
    made: bool = False  # decoded up to its phrase and (when spoken) synthesised, without a failure
    marks_ns: dict[str, int] = field(default_factory=dict)  # start, phrase (decoded), ready (synthesised)

    def spent_tts_ms(self) -> float:
        running = 0.0 if self.tts_start_s is None else 1000.0 * (time.perf_counter() - self.tts_start_s)
        return self.tts_ms + running

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if isinstance(e, LlmToken))

    async def replay(self) -> AsyncIterator[LlmEvent]:
        """Every event of the request: the ones read ahead, then the rest as the engine makes them."""
        for event in self.events:
            yield event
        if self.call is not None and not any(isinstance(e, LlmFinish | LlmError) for e in self.events):
            async for event in self.call:
                yield event


class PhraseHost(Protocol):
    """What a session lends its first phrases (a narrower voice.reply_host.ReplyHost, which holds a FirstPhrases)."""

    session_id: str
    stages: Stages
    settings: SessionSettings
    speak: bool

    @property
    def persona(self) -> PersonaSpec: ...

    @property
    def voice_name(self) -> str: ...

    def messages(self, user_text: str | None = None, joins: int | None = None) -> list[tuple[str, str]]: ...

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Task[Any] | None: ...

    def tools_unfit_ahead(self) -> str | None: ...


class FirstPhrases:
    def __init__(self, session: PhraseHost, enabled: bool, shed_wait_ms: float) -> None:
        self.s = session
        self.core = Preemption(enabled)
        self.shed_wait_ms = shed_wait_ms
        self._held: HeldPhrase | None = None
        self._using: dict[int, HeldPhrase] = {}  # turn -> the held work its reply takes
        self.wasted_tokens = 0  # this session's, in all
        self.wasted_tts_ms = 0.0
        self.shed = 0
        self._turn_waste: dict[int, tuple[int, float]] = {}  # turn -> (tokens, tts ms) thrown away
        self._messages: list[tuple[str, str]] = []  # the prompt of the phrase the core is asked about

    # -- what the session tells ---------------------------------------------------------------------------

    def follow(self, actions: Sequence[Action]) -> None:
        self._run(self.core.follow(actions))

    def after_ahead(self, utt: "Utterance") -> None:
        """The work ahead of this pause is done (called from its task, so before anything waiting on it — the
        end-of-turn check — runs on): go on to the first phrase, if the pause still lasts."""
        if not utt.paused or utt.prefill_result is None or not utt.final_text:
            return  # speech came back, or no prefill (no words, a failure): nothing to go on from
        self._messages = self.s.messages(utt.final_text, utt.trace.info.get("joins"))
        self._run(self.core.ahead_ready(utt.turn_id, utt.final_text, self.s.tools_unfit_ahead() or self.busy()))

    def no_reply(self, turn_id: int) -> None:
        self._run(self.core.no_reply(turn_id))

    def busy(self) -> str | None:
        """Why the shared stages or the engine cannot spare preemptive work now (None: they can)."""
        runner = self.s.stages.runner
        wait_ms = runner.recent_wait_ms()
        if wait_ms is not None and wait_ms > self.shed_wait_ms:
            return f"stage waits p95 {wait_ms:.0f} ms"
        depth = runner.stats.depth if runner.stats is not None else {}
        if sum(n for priority, n in depth.items() if priority != "ahead") > 0:
            return "stage jobs queued"
        others = self.s.stages.llm.other_requests(self.s.session_id)
        if others > 0:
            return f"{others} engine requests of other sessions"
        return None

    async def take(self, turn_id: int, messages: list[tuple[str, str]]) -> HeldPhrase | None:
        """The reply of `turn_id` starts with `messages`: the held work it continues, or None (it runs as before)."""
        held = self._using.pop(turn_id, None)
        if held is None:
            return None
        if held.messages != messages or held.voice != (self.s.voice_name, self.s.speak):
            self._waste(held)
            self._cancel(held)
            return None
        if held.task is not None:
            await asyncio.wait([held.task])  # a miss: the rest of its phrase is still being made
        if not held.made or held.call is None:
            self._cancel(held)
            return None
        held.call.hold(False)
        return held

    def unused(self, turn_id: int) -> None:
        """The reply of `turn_id` will not start after all (a newer one was asked for first): its held work goes."""
        held = self._using.pop(turn_id, None)
        if held is not None:
            self._waste(held)
            self._cancel(held)

    def trace_info(self, turn_id: int, endpoint_ns: int, held: HeldPhrase | None) -> dict[str, Any]:
        """The turn trace's fields: the outcome; for the work the reply continued, when it started, had its phrase
        decoded and synthesised, in ms from the endpoint (negative: before it); the work thrown away (this turn's,
        this session's)."""
        outcome = self.core.outcome(turn_id)
        if outcome is None:
            return {}
        timing = {} if held is None else {"preemptive_ms": {k: round((v - endpoint_ns) / 1e6, 3) for k, v in held.marks_ns.items()}}
        tokens, tts_ms = self._turn_waste.pop(turn_id, (0, 0.0))
        for old in [t for t in self._turn_waste if t < turn_id]:  # turns that never got a reply (joined, dropped)
            del self._turn_waste[old]
        return {"preemptive": outcome, "preemptive_waste": {
            "tokens": tokens, "tts_ms": round(tts_ms, 3),
            "session_tokens": self.wasted_tokens, "session_tts_ms": round(self.wasted_tts_ms, 3)}, **timing}  # fmt: skip

    def close(self) -> None:
        for held in [self._held, *self._using.values()]:
            if held is not None:
                self._cancel(held)
        self._held = None
        self._using.clear()

    # -- running what the core asks -----------------------------------------------------------------------

    def _run(self, actions: list[PreAction]) -> None:
        for a in actions:
            if isinstance(a, StartPhrase):
                self._start(a)
            elif isinstance(a, DropPhrase):
                held, self._held = self._held, None
                if held is not None and held.turn_id == a.turn_id:
                    self._waste(held)
                    self._cancel(held)
            elif isinstance(a, UsePhrase):
                held, self._held = self._held, None
                for turn_id in [t for t in self._using if t != a.turn_id]:
                    self.unused(turn_id)  # a reply asked for earlier that never started
                if held is not None and held.turn_id == a.turn_id:
                    self._using[a.turn_id] = held
            elif isinstance(a, ShedPhrase):
                self.shed += 1

    def _start(self, a: StartPhrase) -> None:
        s = self.s
        held = HeldPhrase(a.turn_id, self._messages, (s.voice_name, s.speak))
        self._held = held
        held.task = s.spawn(self._make, held)
        if held.task is None:  # the session is not running
            self._held = None
            self.core.failed(a.turn_id)

    async def _make(self, held: HeldPhrase) -> None:
        """The reply's own request up to its first phrase (then held in the engine), and that phrase's audio. A
        failure here is no error of the session's: the reply runs as without preemption."""
        s = self.s
        try:
            persona = s.persona
            held.marks_ns["start"] = now_ns()
            held.call = s.stages.llm.generate(s.session_id, held.messages, max_new_tokens=persona.max_reply_tokens,
                                              temperature=persona.temperature)  # fmt: skip
            chunker = PhraseChunker()
            async for event in held.call:
                held.events.append(event)
                if isinstance(event, LlmError):
                    raise RuntimeError(event.message)
                phrases = chunker.push(event.text) if isinstance(event, LlmToken) and event.text else []
                if isinstance(event, LlmFinish):
                    phrases = chunker.flush()
                if phrases:
                    held.phrase = phrases[0]
                    break
                if isinstance(event, LlmFinish):
                    break
            held.call.hold(True)  # the rest waits for the endpoint: the cores go to the synthesis and the check
            held.marks_ns["phrase"] = now_ns()
            if held.phrase is not None and s.speak and not opens_call(held.phrase):  # a call is run, never said
                await self._synthesise(held, held.phrase)
        except asyncio.CancelledError:
            self.core.failed(held.turn_id)
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the reply decodes and synthesises as without preemption
            log.warning("session %s: preemptive first phrase failed: %r", s.session_id, exc)
            self.core.failed(held.turn_id)
            return
        held.made = True
        held.marks_ns["ready"] = now_ns()
        self.core.phrase_ready(held.turn_id)

    async def _synthesise(self, held: HeldPhrase, phrase: str) -> None:
        s = self.s
        binding = s.stages.voices[s.voice_name]
        rate, out_rate = s.persona.speaking_rate, s.settings.output_sample_rate
        held.tts_start_s = time.perf_counter()
        made: list[np.ndarray] = []
        try:
            chunks = synthesize_async(binding.tts, phrase, rate=rate, voice=binding.speaker, work=s.stages.tts_work,
                                      name=f"tts-ahead{held.turn_id}", runner=s.stages.runner, priority=Priority.AHEAD,
                                      key=s.session_id)  # fmt: skip
            async for chunk in chunks:
                made.append(resample(chunk, binding.tts.sample_rate, out_rate))
        finally:
            held.tts_ms, held.tts_start_s = held.spent_tts_ms(), None
        audio = PhraseAudioCache(max_entries=1)
        audio.put(audio.key(phrase, binding.tts, binding.speaker, rate, out_rate), made)
        held.audio = audio

    def _waste(self, held: HeldPhrase) -> None:
        tokens, tts_ms = self._turn_waste.get(held.turn_id, (0, 0.0))
        spent_ms = held.spent_tts_ms()
        self._turn_waste[held.turn_id] = (tokens + held.tokens, tts_ms + spent_ms)
        self.wasted_tokens += held.tokens
        self.wasted_tts_ms += spent_ms

    @staticmethod
    def _cancel(held: HeldPhrase) -> None:
        if held.task is not None and not held.task.done():
            held.task.cancel()
        if held.call is not None:
            asyncio.ensure_future(held.call.aclose())  # cancels the engine request (it holds the session's slot)
