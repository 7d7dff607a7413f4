"""The listening half of a session: audio in -> VAD frames stamped with audio and arrival time, and the work on
one utterance: its audio (held back while the user pauses), partial transcripts, the work done ahead of the
endpoint (the final recognition, then an engine prefill of it that also says whether the text sounds finished),
end-of-turn checks and the final transcript.

It decides nothing (voice.turntaking does; voice.session runs what it asks) and knows nothing of replies or the wire.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.asr import StreamingTranscriber, Transcriber
from voice.audio import SAMPLE_RATE, Framer
from voice.frontend import FrontEnd
from voice.interjection import Heard
from voice.llm_bridge import LlmBridge, LlmFinish
from voice.scheduler import DirectRunner, StageRunner
from voice.smart_turn import TurnModel, with_silence_to_come
from voice.stage_queue import Priority
from voice.trace import TurnTrace, now_ns
from voice.vad import Vad

PREROLL_PAD_MS = 100.0  # audio kept before the qualifying voiced run, so the first word is not clipped
AUDIO_QUEUE_ITEMS = 500  # 10 s of 20 ms messages: a listen loop this far behind is broken, not slow

Prompt = Callable[[str], Sequence[tuple[str, str]]]  # the user's text -> the messages a reply to it would send


class Overloaded(Exception):
    """Audio arrives faster than the listen loop takes it."""


@dataclass(frozen=True)
class HeardFrame:
    prob: float  # the VAD's speech probability
    t_ms: float  # audio time of its first sample
    samples: np.ndarray  # float32 [frame] at 16 kHz


@dataclass
class Utterance:
    """One user turn being heard: its recogniser, the audio held back while paused, and the work ahead."""

    turn_id: int
    trace: TurnTrace
    start_ms: float  # audio time of the first voiced sample
    stt: StreamingTranscriber
    paused: bool = False
    held: list[np.ndarray] = field(default_factory=list)  # audio of the pause: part of the turn only if speech resumes
    partial_task: asyncio.Task[Any] | None = None
    ahead: asyncio.Task[Any] | None = None  # the final decode, then the prefill of it, started at the pause
    ahead_start_ns: int | None = None
    final_text: str = ""
    final_ns: int | None = None
    final_decode_ms: float = 0.0  # the recogniser's own time for the final (asr_ms less waiting and hand-offs)
    final_event: asyncio.Event = field(default_factory=asyncio.Event)
    text_prob: float | None = None  # the prefill's P(the final text is a finished request)
    prefill_start_ns: int | None = None
    prefill_done_ns: int | None = None
    prefill_result: LlmFinish | None = None
    discarded_ahead: int = 0
    audio_ahead: asyncio.Future[Any] | None = None  # the audio model's score for the check, computed at the pause
    warm_task: asyncio.Task[Any] | None = None  # a prefill of the latest partial's prompt, while the user speaks
    warmed_text: str = ""  # the partial text last prefilled
    warm_tokens: int = 0  # tokens those prefills computed
    shedding: bool = False  # a due partial is being held back: the machine cannot spare it now
    queue_ms: dict[str, float] = field(default_factory=dict)  # stage -> ms its jobs for this turn waited for a worker
    own_from: int = 0  # where this turn's own audio starts: before it, the request it may continue

    def feed(self, samples: np.ndarray) -> None:
        if self.paused:
            self.held.append(samples)
        else:
            self.stt.append(samples)

    def audio(self) -> np.ndarray:
        """Everything heard of this turn so far, the pause included: float32 [N] at 16 kHz."""
        return np.concatenate([self.stt.audio(), *self.held]) if self.held else self.stt.audio()

    def pause(self) -> None:
        self.paused = True
        if self.partial_task is not None:  # the final of this audio starts now: a partial of it is not worth a worker
            self.partial_task.cancel()

    def resume(self) -> None:
        """Speech came back: the pause was inside the turn, and anything computed on it is stale."""
        self.paused = False
        for samples in self.held:
            self.stt.append(samples)
        self.held.clear()
        if self.ahead is not None:
            self.discarded_ahead += 1
            self.ahead.cancel()  # an engine prefill in flight is cancelled as its iterator closes
        if self.audio_ahead is not None:
            self.audio_ahead.cancel()
        self.ahead = self.audio_ahead = None
        self.ahead_start_ns = self.final_ns = self.prefill_start_ns = self.prefill_done_ns = None
        self.prefill_result = self.text_prob = None
        self.final_event = asyncio.Event()
        self.final_text = ""

    def discard(self) -> None:
        for task in (self.ahead, self.partial_task, self.warm_task, self.audio_ahead):
            if task is not None:
                task.cancel()

    async def ahead_done(self) -> None:
        """Wait until the work ahead has run to its end (or was cancelled)."""
        if self.ahead is not None:
            await asyncio.wait([self.ahead])

    def savings(self, endpoint_ns: int, llm_start_ns: int | None = None, reply: LlmFinish | None = None) -> dict[str, Any]:
        """What the work ahead of the endpoint saved the reply (`reply`: the reply request's finish, once known).

        asr_ms: the part of the final decode that ran before the endpoint. prefill_tokens: tokens the ahead
        prefill computed; reused_tokens: how many of those the reply took from the cache. prefill_ms: the lesser of
        two estimates of what computing those tokens would have cost the reply: the ahead prefill's engine time
        before the reply's request started, and the reply's own per-token prefill time (the ahead forward may share
        the cores with other work, so its wall time can overstate the work). 0 until the reply's reuse is known."""
        asr_ms = 0.0
        if self.ahead_start_ns is not None and self.final_ns is not None:
            asr_ms = max(0.0, (min(self.final_ns, endpoint_ns) - self.ahead_start_ns) / 1e6)
        prefill_ms, computed, used = 0.0, 0, 0
        result, done = self.prefill_result, self.prefill_done_ns
        if result is not None and done is not None:
            computed = result.prefill_tokens
            if reply is not None and computed > 0:
                # tokens the reply found cached beyond what the cache held before the ahead prefill
                used = max(0, min(computed, reply.reused_tokens - result.reused_tokens))
                compute_start = done - int(result.prefill_ms * 1e6)  # the engine's forward ends at about `done`
                before = (done if llm_start_ns is None else min(done, llm_start_ns)) - compute_start
                ahead_ms = max(0.0, before / 1e6) * used / computed
                reply_ms = reply.prefill_ms / max(1, reply.prefill_tokens) * used
                prefill_ms = min(ahead_ms, reply_ms)
        return {
            "asr_ms": round(asr_ms, 3),
            "asr_decode_ms": round(self.final_decode_ms, 3),
            "prefill_ms": round(prefill_ms, 3),
            "saved_ms": round(asr_ms + prefill_ms, 3),
            "prefill_tokens": computed,
            "reused_tokens": used,
            "shared_prefix_tokens": result.shared_prefix_tokens if result is not None else 0,
            "discarded": self.discarded_ahead,
            "warm_tokens": self.warm_tokens,
        }


class Listener:
    def __init__(
        self,
        session_id: str,
        make_vad: Callable[[], Vad],
        transcriber: Transcriber,
        llm: LlmBridge,
        turn_model: TurnModel | None,
        *,
        partial_interval_ms: int,
        min_speech_ms: float,
        runner: StageRunner | None = None,
        partial_busy_interval_ms: int = 0,
        busy: Callable[[], str | None] = lambda: None,
        frontend: FrontEnd | None = None,
    ) -> None:
        self.frontend = frontend or FrontEnd()  # the microphone's way in, and its clock (voice.frontend)
        self.runner: StageRunner = runner or DirectRunner()
        self.session_id = session_id
        self.make_vad = make_vad
        self.transcriber = transcriber
        self.llm = llm
        self.turn_model = turn_model
        self.partial_interval_ms = partial_interval_ms
        self.partial_busy_interval_ms = partial_busy_interval_ms  # 0: partials are never held back
        self.busy = busy  # why the machine cannot spare optional work now, or None (voice.first_phrase)
        self.min_speech_ms = min_speech_ms
        self.utt: Utterance | None = None  # the user turn being heard, if any
        self._queue: asyncio.Queue[tuple[np.ndarray, int, int, float]] = asyncio.Queue(AUDIO_QUEUE_ITEMS)
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=3000)  # (audio ms of message start, arrival ns)
        self._preroll: deque[np.ndarray] = deque(maxlen=1)
        self._vad: Vad | None = None

    def push(self, samples: np.ndarray, arrival_ns: int, rate: int = SAMPLE_RATE) -> None:
        """float32 [N] at `rate` as it arrived; `arrival_ns` is perf_counter_ns at receipt."""
        if self._queue.full():
            raise Overloaded
        t_ms = self.frontend.receive(samples, rate)
        self._queue.put_nowait((samples, rate, arrival_ns, t_ms))

    async def start(self) -> Vad:
        """Build and warm this session's VAD (a model's first calls are slow) off the loop; audio arriving
        meanwhile waits in the queue and is processed in order, with its arrival times."""
        vad = self._vad = await asyncio.to_thread(self._new_vad)
        self._preroll = deque(maxlen=max(1, int((self.min_speech_ms + PREROLL_PAD_MS) / vad.frame_ms) + 1))
        return vad

    def _new_vad(self) -> Vad:
        vad = self.make_vad()
        silent = np.zeros(int(SAMPLE_RATE * vad.frame_ms / 1000), dtype=np.float32)
        for _ in range(3):
            vad.speech_prob(silent)
        vad.reset()
        return vad

    async def frames(self) -> AsyncIterator[HeardFrame]:
        """Every VAD frame of the audio, in order; runs until cancelled."""
        vad = self._vad
        if vad is None:
            raise RuntimeError("start() first")
        framer = Framer(SAMPLE_RATE, vad.frame_ms)
        while True:
            samples, rate, arrival_ns, t_ms = await self._queue.get()
            self._arrivals.append((t_ms, arrival_ns))
            for frame in framer.push(await self.frontend.process(samples, rate)):
                yield HeardFrame(vad.speech_prob(frame.samples), frame.t_ms, frame.samples)

    def arrival_ns(self, t_ms: float) -> int:
        """Arrival time of the client message holding audio time `t_ms` (the latest one starting at or before it)."""
        for start_ms, arrival_ns in reversed(self._arrivals):
            if start_ms <= t_ms:
                return arrival_ns
        return self._arrivals[0][1] if self._arrivals else now_ns()

    # -- one utterance ----------------------------------------------------------------------------------------

    def open(self, turn_id: int, trace: TurnTrace, start_ms: float, continues: Utterance | None = None) -> Utterance:
        """A new turn from the audio kept before its speech qualified; `continues`: the ended turn whose request
        this speech goes on with, so its audio (and with it the final transcript) covers the whole request."""
        stt = StreamingTranscriber(self.transcriber, self.partial_interval_ms, runner=self.runner, key=self.session_id)
        if continues is not None:
            stt.append(continues.stt.audio())
        own_from = len(stt.audio())
        for samples in self._preroll:
            stt.append(samples)
        self._preroll.clear()
        self.utt = Utterance(turn_id, trace, start_ms, stt, own_from=own_from)
        return self.utt

    def feed(self, samples: np.ndarray) -> bool:
        """A frame's audio, to the turn being heard or the pre-roll. -> whether a partial transcript is due."""
        utt = self.utt
        if utt is None:
            self._preroll.append(samples)
            return False
        utt.feed(samples)
        if utt.paused or not (utt.partial_task is None or utt.partial_task.done()) or not utt.stt.partial_due():
            return False
        return self._spare_partial(utt)

    def _spare_partial(self, utt: Utterance) -> bool:
        """A partial is optional work (the final is what the user waits for): while the machine cannot spare it,
        one runs only every `partial_busy_interval_ms` of new audio; the trace counts the ones held back."""
        if not self.partial_busy_interval_ms or utt.stt.partial_due(self.partial_busy_interval_ms) or self.busy() is None:
            utt.shedding = False
            return True
        if not utt.shedding:
            utt.shedding = True
            utt.trace.info["partials_shed"] = int(utt.trace.info.get("partials_shed", 0)) + 1
        return False

    def close(self, utt: Utterance) -> None:
        """The turn is no longer being heard (ended or dropped): new audio goes to the pre-roll."""
        if self.utt is utt:
            self.utt = None

    async def partial(self, utt: Utterance) -> str | None:
        """Re-decode the utterance so far; -> the committed text when it grew."""
        return await utt.stt.partial()

    async def warm(self, utt: Utterance, prompt: Prompt) -> None:
        """While the user speaks: the reply's prompt with the latest partial's words, prefilled into the session's
        cache, so the prefill at the pause computes only the tokens after what it shares with the final's (the
        cache keeps the longest common prefix). Wrong last words cost a few tokens computed again."""
        text = utt.stt.hypothesis
        if not text or text == utt.warmed_text:
            return
        utt.warmed_text = text
        result = await self.llm.prefill(self.session_id, prompt(text))
        if isinstance(result, LlmFinish):
            utt.warm_tokens += result.prefill_tokens

    async def ahead(self, utt: Utterance, prompt: Prompt, probe: bool) -> None:
        """At the pause: the final decode of the audio so far (none reaches the recogniser while paused, and a
        resume cancels this), then an engine prefill of the reply's prompt with that text, so the reply finds it
        cached; with `probe`, the prefill also scores whether the text is a finished request."""
        utt.ahead_start_ns = now_ns()
        try:
            transcript = await utt.stt.final()
            utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
            utt.final_decode_ms = transcript.decode_ms
            utt.queue_ms["asr"] = transcript.queue_ms
        finally:
            utt.final_event.set()  # also when the decode failed: the finish decodes again
        if not utt.final_text:
            return
        utt.prefill_start_ns = now_ns()
        result = await self.llm.prefill(self.session_id, prompt(utt.final_text), probe_user_end=probe)
        if isinstance(result, LlmFinish):
            utt.prefill_done_ns, utt.prefill_result, utt.text_prob = now_ns(), result, result.end_prob

    def score_ahead(
        self, utt: Utterance, silence_ms: float, check_ms: float, *, after_text: Callable[[float | None], bool] | None = None
    ) -> None:
        """At the pause (`silence_ms` of it heard): start the audio model on the turn as the check will hear it at
        `check_ms` of silence, the pause's quietest 10 ms repeated for the silence still to come (the room's own
        floor, never a word's tail), so at the check the cores go to the reply's first phrase instead; the check
        takes this score (speech that comes back drops it; None: not run). `after_text`, for a check that waits for
        the text's probability anyway: the model runs once the work ahead is done (the final recognition and its
        prefill, both on the reply's path: beside the model a tiny.en final took 77-100 ms against 54-59 alone on two
        cores, bench/stage_threads.py), and only when after_text(that probability) says its score could still change
        the wait (TurnPolicy.audio_can_change)."""
        if self.turn_model is None:
            return
        padded = with_silence_to_come(utt.audio(), silence_ms, check_ms)
        model = self.turn_model

        async def score() -> Any:
            if after_text is not None:
                await utt.ahead_done()
                if not after_text(utt.text_prob):
                    return None
            return await self.runner.run("turn", Priority.WAITED, self.session_id, model.complete_prob, padded)

        utt.audio_ahead = asyncio.ensure_future(score())
        utt.audio_ahead.add_done_callback(lambda f: f.cancelled() or f.exception())  # a turn with no check: no warning

    async def check(self, utt: Utterance, audio: bool, text: bool) -> tuple[float | None, float | None, float]:
        """One end-of-turn check -> (audio model's P(complete), the text's P(end), ms it took). The audio model runs
        on the turn's audio up to now (or its score from the pause, `score_ahead`); the text's comes from the work
        ahead, waited for."""
        t0 = time.perf_counter()
        audio_task = None
        if audio and self.turn_model is not None and utt.audio_ahead is not None and not utt.audio_ahead.cancelled():
            audio_task = utt.audio_ahead
        elif audio and self.turn_model is not None:
            audio_task = asyncio.ensure_future(
                self.runner.run("turn", Priority.WAITED, self.session_id, self.turn_model.complete_prob, utt.audio())
            )
        text_prob = None
        try:
            if text:
                await utt.ahead_done()
                text_prob = utt.text_prob
            audio_prob = None
            ran = await audio_task if audio_task is not None else None
            if ran is not None:
                audio_prob = ran.value
                utt.queue_ms["turn"] = round(utt.queue_ms.get("turn", 0.0) + ran.wait_ms, 3)
        finally:
            if audio_task is not None and not audio_task.done():
                audio_task.cancel()
        return audio_prob, text_prob, 1000.0 * (time.perf_counter() - t0)

    async def interjection(self, utt: Utterance) -> Heard:
        """A quick recognition of the turn's own audio so far (not the request it may continue): what speech over a
        reply is saying, while the reply holds. At the priority of an end-of-turn check: someone waits on it."""
        audio = utt.audio()[utt.own_from :]
        ran = await self.runner.run("asr", Priority.WAITED, self.session_id, self.transcriber.transcribe, audio)
        utt.queue_ms["interjection"] = round(utt.queue_ms.get("interjection", 0.0) + ran.wait_ms, 3)
        t = ran.value
        return Heard(t.text, t.avg_logprob, t.audio_ms)

    async def final(self, utt: Utterance) -> str:
        """The final transcript: from the work ahead when it ran, else decoded now."""
        if utt.ahead is not None:
            await utt.final_event.wait()
        if utt.final_ns is None:  # no work ahead (or it failed): recognise now
            transcript = await utt.stt.final()
            utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
            utt.queue_ms["asr"] = transcript.queue_ms
        return utt.final_text
