"""The listening half of a session: audio in -> VAD -> endpointer -> utterances with partials, barge-in
decisions and the work done ahead of the endpoint (final recognition beside an engine prefill).

It hands each finished user turn to its `Conversation` (the Session) and knows nothing of replies, TTS or
the wire beyond the events it sends through the outbox.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from voice.asr import StreamingTranscriber, Transcriber
from voice.audio import Framer
from voice.endpointer import Endpointer, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted
from voice.listen import Utterance
from voice.llm_bridge import LlmBridge, LlmFinish
from voice.outbox import Outbox
from voice.trace import TurnTrace, now_ns
from voice.vad import Vad

SAMPLE_RATE = 16000  # what VAD and ASR take; the socket layer resamples other client rates
PREROLL_PAD_MS = 100.0  # audio kept before the qualifying voiced run, so the first word is not clipped
AUDIO_QUEUE_ITEMS = 500  # 10 s of 20 ms messages: a listen loop this far behind is broken, not slow


class Overloaded(Exception):
    """Audio arrives faster than the listen loop takes it."""


class Conversation(Protocol):
    """What the listener needs from its session."""

    session_id: str
    outbox: Outbox

    def replying(self) -> bool: ...
    def new_turn(self) -> int: ...
    def new_trace(self, turn_id: int, kind: str) -> TurnTrace: ...
    def interrupt(self, t_ms: float | None = None) -> None: ...
    def messages(self, user_text: str | None = None) -> list[tuple[str, str]]: ...
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Task[Any] | None: ...
    async def user_turn(self, utt: Utterance) -> None: ...


class Listener:
    def __init__(
        self,
        conv: Conversation,
        make_vad: Callable[[], Vad],
        transcriber: Transcriber,
        llm: LlmBridge,
        *,
        vad_threshold: float,
        min_speech_ms: float,
        hangover_ms: float,
        barge_in_min_speech_ms: float,
        partial_interval_ms: int,
    ) -> None:
        self.conv = conv
        self.make_vad = make_vad
        self.transcriber = transcriber
        self.llm = llm
        self.vad_threshold = vad_threshold
        self.min_speech_ms = min_speech_ms
        self.hangover_ms = hangover_ms
        self.barge_in_min_speech_ms = barge_in_min_speech_ms
        self.partial_interval_ms = partial_interval_ms
        self.utt: Utterance | None = None  # the user turn being heard, if any
        self._queue: asyncio.Queue[tuple[np.ndarray, int]] = asyncio.Queue(AUDIO_QUEUE_ITEMS)
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=3000)  # (audio ms of message start, arrival ns)
        self._audio_in_ms = 0.0

    def push(self, samples: np.ndarray, arrival_ns: int) -> None:
        """16 kHz float32 [N] as it arrived; `arrival_ns` is perf_counter_ns at receipt."""
        try:
            self._queue.put_nowait((samples, arrival_ns))
        except asyncio.QueueFull:
            raise Overloaded from None

    def _new_vad(self) -> Vad:
        """Build and warm this session's VAD (a TorchScript model's first calls are slow) off the loop;
        audio arriving meanwhile waits in the queue and is processed in order, with its arrival times."""
        vad = self.make_vad()
        silent = np.zeros(int(SAMPLE_RATE * vad.frame_ms / 1000), dtype=np.float32)
        for _ in range(3):
            vad.speech_prob(silent)
        vad.reset()
        return vad

    async def run(self) -> None:
        """The listen loop: runs until cancelled."""
        vad = await asyncio.to_thread(self._new_vad)
        framer = Framer(SAMPLE_RATE, vad.frame_ms)
        endpointer = Endpointer.for_vad(vad, self.vad_threshold, self.min_speech_ms, self.hangover_ms)
        preroll: deque[np.ndarray] = deque(maxlen=max(1, int((self.min_speech_ms + PREROLL_PAD_MS) / vad.frame_ms) + 1))
        while True:
            samples, arrival_ns = await self._queue.get()
            self._arrivals.append((self._audio_in_ms, arrival_ns))
            self._audio_in_ms += 1000.0 * len(samples) / SAMPLE_RATE
            for frame in framer.push(samples):
                for event in endpointer.push(vad.speech_prob(frame.samples), frame.t_ms):
                    self._on_vad(event, preroll)
                utt = self.utt
                if utt is None:
                    preroll.append(frame.samples)
                    continue
                utt.feed(frame.samples)
                if not utt.paused:
                    self._maybe_partial(utt)
                    voiced_ms = frame.end_ms - utt.start_ms
                    if utt.during_reply and not utt.barged and voiced_ms >= self.barge_in_min_speech_ms:
                        utt.barged = True
                        self.conv.interrupt(t_ms=frame.end_ms)

    def _on_vad(self, event: object, preroll: deque[np.ndarray]) -> None:
        conv = self.conv
        if isinstance(event, SpeechStarted):
            turn_id = conv.new_turn()
            trace = conv.new_trace(turn_id, "voice")
            trace.mark("speech_start", self._arrival_ns(event.t_ms))
            stt = StreamingTranscriber(self.transcriber, self.partial_interval_ms)
            for samples in preroll:
                stt.append(samples)
            preroll.clear()
            self.utt = Utterance(turn_id, trace, event.t_ms, stt, during_reply=conv.replying())
            conv.outbox.send("vad.speech_started", t_ms=round(event.t_ms, 1))
        elif isinstance(event, SpeechPaused) and self.utt is not None:
            utt = self.utt
            utt.pause()
            if not utt.during_reply or utt.barged:
                self._start_ahead(utt)
        elif isinstance(event, SpeechResumed) and self.utt is not None:
            self.utt.resume()
        elif isinstance(event, SpeechEnded) and self.utt is not None:
            utt, self.utt = self.utt, None
            # the last voiced sample lies just before t_ms; the message that carried it arrived at:
            utt.trace.mark("speech_end", self._arrival_ns(event.t_ms - 0.001))
            utt.trace.mark("endpoint")
            conv.outbox.send("vad.speech_ended", t_ms=round(event.t_ms, 1))
            if utt.during_reply and not utt.barged:  # a backchannel or cough under the reply: not a turn
                utt.discard()
                return
            conv.spawn(self._finish, utt)

    def _maybe_partial(self, utt: Utterance) -> None:
        if utt.partial_task is None or utt.partial_task.done():
            if utt.stt.partial_due():
                utt.partial_task = self.conv.spawn(self._partial, utt)

    async def _partial(self, utt: Utterance) -> None:
        text = await utt.stt.partial()
        if text is not None and utt is self.utt:
            self.conv.outbox.send("transcript.partial", turn_id=utt.turn_id, text=text)

    # -- ahead of the endpoint ----------------------------------------------------------------------

    def _start_ahead(self, utt: Utterance) -> None:
        """At SpeechPaused, side by side: the final decode of the audio so far, and an engine prefill of the
        conversation plus the committed (LocalAgreement) text, so the reply's prompt finds its prefix cached."""
        utt.ahead_start_ns = now_ns()
        utt.ahead = self.conv.spawn(self._ahead_final, utt)
        if not self.conv.replying():
            committed = utt.stt.committed.strip()
            messages = self.conv.messages(committed or None)
            utt.prefill = self.conv.spawn(self._ahead_prefill, utt, messages)

    async def _ahead_final(self, utt: Utterance) -> None:
        # no audio reaches the transcriber while paused (it is held), and a resume cancels this task before it
        # can start: the final decodes exactly the audio up to the pause
        transcript = await utt.stt.final()
        utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
        utt.final_event.set()

    async def _ahead_prefill(self, utt: Utterance, messages: list[tuple[str, str]]) -> None:
        utt.prefill_start_ns = now_ns()
        result = await self.llm.prefill(self.conv.session_id, messages)
        if isinstance(result, LlmFinish):
            utt.prefill_done_ns, utt.prefill_result = now_ns(), result

    async def _finish(self, utt: Utterance) -> None:
        """After the endpoint: take the final (from the hangover when it ran there), then hand the turn over.
        The ahead prefill is not waited for: the engine runs the reply's request right behind it."""
        trace = utt.trace
        if utt.ahead is not None:
            await utt.final_ready()  # recognition that ran during the hangover
        if utt.final_ns is None:  # no ahead work (or it was discarded): recognise now
            transcript = await utt.stt.final()
            utt.final_text, utt.final_ns = transcript.text.strip(), now_ns()
        trace.mark("asr_final", utt.final_ns)
        self.conv.outbox.send("transcript.final", turn_id=utt.turn_id, text=utt.final_text)
        if not utt.final_text:
            utt.discard()
            return
        await self.conv.user_turn(utt)

    def _arrival_ns(self, t_ms: float) -> int:
        """Arrival time of the client message holding audio time `t_ms` (the latest one starting at or before it)."""
        for start_ms, arrival_ns in reversed(self._arrivals):
            if start_ms <= t_ms:
                return arrival_ns
        return self._arrivals[0][1] if self._arrivals else now_ns()
