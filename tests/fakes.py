"""Fakes for orchestration tests: the same shapes as the real stages (Vad, Transcriber, Engine, Tts), with
scripted, deterministic behaviour and counters tests assert on. No models, no inheritance.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_engine.request import ErrorEvent, FinishEvent, GenerateRequest, Timings, TokenEvent
from voice.asr import Transcript
from voice.conversation import Conversation
from voice.llm_bridge import LlmBridge
from voice.outbox import OutAudio
from voice.reply import VoiceBinding
from voice.session import Session
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.trace import TurnTrace
from voice.turn_policy import TurnPolicy
from support.messages import MessageLog

RATE = 16000


def tone(ms: float, level: float = 0.3, rate: int = RATE) -> np.ndarray:
    """'Speech' for FakeVad: a loud sine (float32 [N])."""
    n = int(round(ms * rate / 1000))
    return (level * np.sin(2 * np.pi * 220 * np.arange(n) / rate)).astype(np.float32)


def quiet(ms: float, rate: int = RATE) -> np.ndarray:
    return np.zeros(int(round(ms * rate / 1000)), dtype=np.float32)


class FakeVad:
    """Voiced when the frame's RMS is over 0.02: tests script speech as tone() and silence as quiet()."""

    frame_ms = 20
    sample_rate = RATE
    end_lag_ms = 0.0

    def __init__(self) -> None:
        self.frames = 0

    def speech_prob(self, frame: np.ndarray) -> float:
        self.frames += 1
        return 1.0 if float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) > 0.02 else 0.0

    def reset(self) -> None:
        self.frames = 0


class FakeTranscriber:
    """Hears `text` (empty for audio shorter than `min_audio_ms`), or with `by_length` [(min audio ms, text)] the
    text of the longest length the audio reaches; records each call's audio length."""

    streams_partials = True
    transcribe_batch = None

    def __init__(self, text: str = "what is the weather like today", delay_s: float = 0.0, min_audio_ms: float = 100.0,
                 by_length: list[tuple[float, str]] | None = None) -> None:  # fmt: skip
        self.text = text
        self.delay_s = delay_s
        self.min_audio_ms = min_audio_ms
        self.by_length = sorted(by_length or [])
        self.calls_ms: list[float] = []

    def transcribe(self, audio: np.ndarray) -> Transcript:
        audio_ms = 1000.0 * len(audio) / RATE
        self.calls_ms.append(audio_ms)
        if self.delay_s:
            time.sleep(self.delay_s)
        text = self.text if audio_ms >= self.min_audio_ms else ""
        if self.by_length:
            text = next((t for ms, t in reversed(self.by_length) if audio_ms >= ms), "")
        return Transcript(text=text, no_speech_prob=0.0, avg_logprob=-0.1, audio_ms=audio_ms, decode_ms=1000 * self.delay_s)


@dataclass
class _Job:
    req: GenerateRequest
    on_event: Callable[[object], None] | None
    stream: "FakeStream"
    submitted_ns: int = 0


class FakeStream:
    def __init__(self) -> None:
        self.events: queue.Queue[object] = queue.Queue()
        self.cancelled = threading.Event()
        self.holds: list[bool] = []  # hold(True/False) calls, in order (the fake does not pause)

    def __iter__(self) -> Iterator[object]:
        while True:
            ev = self.events.get()
            yield ev
            if isinstance(ev, FinishEvent | ErrorEvent):
                return

    def cancel(self) -> None:
        self.cancelled.set()

    def hold(self, on: bool = True) -> None:
        self.holds.append(on)


@dataclass
class FakeEngine:
    """One worker thread like the real engine. Replies are `reply_words` (one word per token, `token_s` apart);
    a session's slot remembers its prompt 'tokens' (words of the rendered messages) for the reuse count."""

    reply_words: list[str] = field(default_factory=lambda: "Sure. It is sunny today, with a light breeze from the west.".split())
    token_s: float = 0.01
    first_token_s: float = 0.02
    prefill_s: float = 0.0  # the prompt's forward, for every request (prefill-only ones too)
    error: str | None = None
    end_probs: dict[str, float] = field(default_factory=dict)  # user text -> a probe's end_prob (default 0.9)
    requests: list[GenerateRequest] = field(default_factory=list)
    submitted_ns: list[int] = field(default_factory=list)  # perf_counter_ns of each submit, as `requests`
    streams: list[FakeStream] = field(default_factory=list)  # each request's stream, as `requests` (its holds)
    prefilled_ns: list[int] = field(default_factory=list)  # when each request's prefill ended, in run order
    finished: list[FinishEvent] = field(default_factory=list)
    cancelled: int = 0  # generations stopped mid-way
    cancelled_queued: int = 0  # requests cancelled before they ran
    slots: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-engine")
        self._thread.start()

    def submit(self, req: GenerateRequest, on_event: Callable[[object], None] | None = None) -> FakeStream:
        stream = FakeStream()
        self.submitted_ns.append(time.perf_counter_ns())
        self.requests.append(req)
        self.streams.append(stream)
        self._jobs.put(_Job(req, on_event, stream, self.submitted_ns[-1]))
        return stream

    def release(self, session_id: str) -> None:
        with self._lock:
            self.slots.pop(session_id, None)

    def active_slots(self) -> int:
        with self._lock:
            return len(self.slots)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    def _emit(self, job: _Job, ev: object) -> None:
        job.stream.events.put(ev)
        if job.on_event is not None:
            job.on_event(ev)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            prompt = [w for m in job.req.messages for w in (m.role, *m.content.split())]
            with self._lock:
                cached = self.slots.get(job.req.session_id, [])
                reused = 0
                while reused < min(len(cached), len(prompt)) and cached[reused] == prompt[reused]:
                    reused += 1
                self.slots[job.req.session_id] = list(prompt)
            if self.error is not None:
                self._emit(job, ErrorEvent(self.error))
                continue
            queue_ms = (time.perf_counter_ns() - job.submitted_ns) / 1e6
            if job.stream.cancelled.is_set():  # cancelled while queued: the real engine never prefills it
                with self._lock:
                    self.slots[job.req.session_id] = cached
                self.cancelled_queued += 1
                finish = FinishEvent("cancelled", Timings(queue_ms=queue_ms))
                self.finished.append(finish)
                self._emit(job, finish)
                continue
            time.sleep(self.prefill_s)
            self.prefilled_ns.append(time.perf_counter_ns())
            limit = job.req.sampling.max_new_tokens
            reason, n = "length", 0
            time.sleep(self.first_token_s if limit else 0.0)
            for i, word in enumerate(self.reply_words[:limit]):
                if job.stream.cancelled.is_set():
                    reason = "cancelled"
                    self.cancelled += 1
                    break
                self._emit(job, TokenEvent(i, word if i == 0 else " " + word))
                n += 1
                time.sleep(self.token_s)
            else:
                reason = "stop" if limit > len(self.reply_words) else "length"
            timings = Timings(queue_ms=queue_ms, prefill_ms=max(1.0, 1000 * self.prefill_s), prefill_tokens=len(prompt) - reused,
                              reused_tokens=reused, decode_tokens=n)  # fmt: skip
            end_prob = self.end_probs.get(job.req.messages[-1].content, 0.9) if job.req.probe_user_end else None
            finish = FinishEvent(reason, timings, end_prob)
            self.finished.append(finish)
            self._emit(job, finish)


class FakeTurnModel:
    """The audio end-of-turn model: `prob`, whatever it hears; records the audio length of each check."""

    def __init__(self, prob: float = 0.9) -> None:
        self.prob = prob
        self.calls_ms: list[float] = []

    def complete_prob(self, audio: np.ndarray) -> float:
        self.calls_ms.append(1000.0 * len(audio) / RATE)
        return self.prob


class FakeTts:
    """`ms_per_word` of tone per word, one chunk per word; counts syntheses running and closed early."""

    def __init__(self, sample_rate: int = RATE, ms_per_word: float = 150.0, delay_s: float = 0.0) -> None:
        self.sample_rate = sample_rate
        self.ms_per_word = ms_per_word
        self.delay_s = delay_s
        self.calls: list[tuple[str, float, str | None]] = []
        self.active = 0
        self.closed_early = 0

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        self.calls.append((text, rate, voice))
        self.active += 1
        words = text.split()
        done = 0
        try:
            for _ in words:
                if self.delay_s:
                    time.sleep(self.delay_s)
                yield tone(self.ms_per_word, 0.2, self.sample_rate)
                done += 1
        finally:
            self.active -= 1
            if done < len(words):
                self.closed_early += 1


# -- a Session wired to fakes, with its outbox drained the way the socket writer would ------------------

PERSONAS = {
    "assistant": PersonaSpec("assistant", "You are a test assistant.", "joe", greeting="Hello there.", max_reply_tokens=50),
    "concise": PersonaSpec("concise", "Be brief.", "kal", greeting=None, speaking_rate=1.25, max_reply_tokens=3),
    "storyteller": PersonaSpec("storyteller", "Tell tales.", "kal", greeting="Hello there, traveller.", max_reply_tokens=50),
}


class Harness(MessageLog):
    """`async with Harness(...) as h:` runs a Session on fakes; `h.messages` is everything it sent, in order:
    JSON bodies as dicts, audio as {"type": "audio", "turn_id", "seq", "ms"}."""

    def __init__(
        self,
        *,
        engine: FakeEngine | None = None,
        transcriber: FakeTranscriber | None = None,
        tts: FakeTts | None = None,
        turn_model: FakeTurnModel | None = None,
        persona: str = "assistant",
        turns: TurnPolicy | None = None,
        personas: dict[str, PersonaSpec] | None = None,
        conversation: Conversation | None = None,
        keep_conversation: bool = False,
        user: str = "",
        **settings: object,
    ) -> None:
        self.own_engine = engine is None  # stopped at the end; one passed in may serve another harness after
        self.keep_conversation = keep_conversation
        self.engine = engine or FakeEngine()
        self.transcriber = transcriber or FakeTranscriber()
        self.tts = tts or FakeTts()
        self.turn_model = turn_model
        self.kal = FakeTts(sample_rate=8000)
        self.traces: list[TurnTrace] = []
        self.stages = Stages(
            make_vad=FakeVad,
            transcriber=self.transcriber,
            llm=LlmBridge(self.engine),
            voices={"joe": VoiceBinding(self.tts), "kal": VoiceBinding(self.kal, "kal")},
            turn_model=turn_model,
        )
        base = dict(greet=False, warm_prompt=False, output_sample_rate=RATE, budgets_ms={"voice_to_voice": 1800.0, "asr": 300.0},
                    turns=turns or TurnPolicy(detection="fixed"))  # fmt: skip
        self.settings = SessionSettings(**{**base, **settings})  # type: ignore[arg-type]
        self.session = Session("s1", self.stages, self.settings, personas or PERSONAS, persona, on_trace=self.traces.append,
                               conversation=conversation, user=user)  # fmt: skip
        self.messages: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self.audio_ms = 0.0  # audio fed so far (the client's clock)

    async def __aenter__(self) -> "Harness":
        self._run = asyncio.create_task(self.session.run())
        self._drain = asyncio.create_task(self._drain_outbox())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close(keep=self.keep_conversation)
        for task in (self._run, self._drain):
            task.cancel()
        await asyncio.gather(self._run, self._drain, return_exceptions=True)
        if self.own_engine:
            self.engine.stop()

    async def _drain_outbox(self) -> None:
        while True:
            item = await self.session.outbox.get()
            if isinstance(item, OutAudio):
                ms = 1000.0 * len(item.pcm16) / 2 / self.settings.output_sample_rate
                self.messages.append({"type": "audio", "turn_id": item.turn_id, "seq": item.seq, "ms": ms})
                if item.on_sent is not None:
                    item.on_sent()
            else:
                self.messages.append(item.body)
            self._changed.set()

    async def feed(self, audio: np.ndarray, *, chunk_ms: float = 20.0, pause_s: float = 0.002,
                   until: Callable[[], bool] | None = None) -> float | None:
        """Push audio in `chunk_ms` messages, yielding between them. Returns the audio time (ms) at which
        `until()` first held, checked after each chunk, or None."""
        n = int(RATE * chunk_ms / 1000)
        for i in range(0, len(audio), n):
            self.session.push_audio(audio[i : i + n], time.perf_counter_ns())
            self.audio_ms += 1000.0 * len(audio[i : i + n]) / RATE
            await asyncio.sleep(pause_s)
            if until is not None and until():
                return self.audio_ms
        return None
