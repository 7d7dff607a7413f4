"""One spoken reply: text deltas -> phrases -> TTS audio (worker thread) -> the session outbox, paced.

Also the bookkeeping barge-in needs: which phrase covers which stretch of the reply's audio, so a played
duration maps back to the words actually heard. Knows nothing of the LLM, VAD or the wire.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field

import numpy as np

from voice.audio import float_to_pcm16, resample
from voice.chunker import PhraseChunker
from voice.outbox import Outbox
from voice.phrase_audio import PhraseAudioCache
from voice.scheduler import StageRunner
from voice.stage_queue import Priority
from voice.trace import TurnTrace
from voice.tts import Tts
from voice.tts_stream import synthesize_async

AUDIO_PIECE_MS = 100.0  # audio message size: small enough that a clear drops little, large enough to be cheap
MARK_CARRY_S = 1.0  # after a playback mark, playback is taken to go on this long (clients mark every ~250 ms)
PACE_POLL_S = 0.1  # how often a reply waiting for playback looks again (a new mark wakes it at once)


@dataclass(frozen=True)
class VoiceBinding:
    """A configured voice: the backend object (one per backend, shared) and the speaker it is asked for."""

    tts: Tts
    speaker: str | None = None


@dataclass(frozen=True)
class PhraseSpan:
    text: str
    start_ms: float  # audio time within the reply where this phrase starts
    end_ms: float  # where its audio synthesised so far ends
    complete: bool = True  # False while its synthesis is still running: end_ms is not its real end yet


def spoken_text(spans: list[PhraseSpan], played_ms: float) -> str:
    """The words whose audio lies within the first `played_ms` of the reply (a phrase cut mid-way keeps the
    share of its words proportional to the share of its audio played). A phrase still being synthesised is
    taken to last as long as its text would at the pace of the finished phrases, so hearing all of its audio
    so far does not count as hearing all of its words."""
    done = [s for s in spans if s.complete and s.text]
    ms_per_char = sum(s.end_ms - s.start_ms for s in done) / sum(len(s.text) for s in done) if done else 0.0
    words: list[str] = []
    for span in spans:
        length_ms = span.end_ms - span.start_ms
        if not span.complete:
            length_ms = max(length_ms, ms_per_char * len(span.text))
        end_ms = span.start_ms + length_ms
        if played_ms >= end_ms:  # (a first phrase still being synthesised has no pace to go by: its audio so far)
            words.extend(span.text.split())
            continue
        if played_ms > span.start_ms and length_ms > 0:
            phrase_words = span.text.split()
            share = (played_ms - span.start_ms) / length_ms
            words.extend(phrase_words[: int(share * len(phrase_words))])
        break
    return " ".join(words)


class WorkCounter:
    """Counts TTS syntheses running in worker threads (the no-leak tests read it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def __enter__(self) -> "WorkCounter":
        with self._lock:
            self._n += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._n -= 1

    @property
    def active(self) -> int:
        return self._n



@dataclass
class Reply:
    turn_id: int
    outbox: Outbox
    voice: VoiceBinding | None  # None: text only (what was written counts as said)
    speaking_rate: float
    output_sample_rate: int
    trace: TurnTrace | None
    tts_work: WorkCounter
    audio_lead_ms: float = 1000.0  # how far audio may run ahead of real-time playback (bounds what a clear drops)
    runner: StageRunner | None = None  # the shared-stage scheduler the syntheses run on (None: a thread each)
    key: str = ""  # the session, for the scheduler
    phrase_cache: PhraseAudioCache | None = None  # fixed words (a greeting): their audio is reused, made once
    clock: Callable[[], float] = time.monotonic  # seconds; the pacing's (tests script it)
    text: str = ""
    spans: list[PhraseSpan] = field(default_factory=list)
    queued_ms: float = 0.0  # reply audio handed to the outbox
    sent_ms: float = 0.0  # reply audio written to the socket
    played_ms: float | None = None  # the client's latest playback mark for it
    stopped: bool = False  # told to stop (its audio cleared, its task cancelled)
    waiting_for_playback: bool = False  # its next audio (and so its next phrase's synthesis) waits for playback
    _first_sent_s: float | None = None
    _phrases: int = 0  # phrases written
    _hold: Callable[[bool], None] = field(default=lambda on: None, repr=False)
    _mark: tuple[float, float] | None = None  # (played_ms > 0, clock() at its arrival): the latest mark of progress
    _marked: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # set by each mark: pacing looks again

    async def run(self, deltas: AsyncIterator[str], hold: Callable[[bool], None] = lambda on: None) -> None:
        """Speak everything `deltas` yields. Cancelling stops generation, synthesis and queued audio.

        `hold(True)` is called once the first phrase is written and `hold(False)` once its first audio is out:
        the writer of `deltas` pauses meanwhile, so the synthesis the user is waiting for has the cores."""
        phrases: asyncio.Queue[str | None] = asyncio.Queue()
        self._hold = hold
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._write_text(deltas, phrases))
                tg.create_task(self._speak(phrases))
        finally:
            hold(False)

    async def _write_text(self, deltas: AsyncIterator[str], phrases: asyncio.Queue[str | None]) -> None:
        chunker = PhraseChunker()
        try:
            async for delta in deltas:
                if not delta:
                    continue
                self.text += delta
                self.outbox.send("response.text.delta", turn_id=self.turn_id, text=delta)
                for phrase in chunker.push(delta):
                    self._phrase(phrase, phrases)
            for phrase in chunker.flush():
                self._phrase(phrase, phrases)
        finally:
            phrases.put_nowait(None)

    def _phrase(self, phrase: str, phrases: asyncio.Queue[str | None]) -> None:
        if self._phrases == 0:
            if self.trace is not None:
                self.trace.mark("first_phrase")
            self._hold(True)
        self._phrases += 1
        phrases.put_nowait(phrase)

    async def _speak(self, phrases: asyncio.Queue[str | None]) -> None:
        if self.voice is None:
            while (phrase := await phrases.get()) is not None:
                self._hold(False)
                self.spans.append(PhraseSpan(phrase, 0.0, 0.0))
            return
        while (phrase := await phrases.get()) is not None:
            start_ms = self.spans[-1].end_ms if self.spans else 0.0
            self.spans.append(PhraseSpan(phrase, start_ms, start_ms, complete=False))
            async for chunk in self._synthesize(phrase):
                # the span grows as its audio is known, so a barge-in mid-phrase maps to the right words
                last = self.spans[-1]
                chunk_ms = 1000.0 * len(chunk) / self.output_sample_rate
                self.spans[-1] = PhraseSpan(last.text, last.start_ms, last.end_ms + chunk_ms, complete=False)
                if len(self.spans) == 1 and last.end_ms == 0.0:
                    self._hold(False)  # the first audio is here: the text may go on
                await self._send_audio(chunk)
            last = self.spans[-1]
            self.spans[-1] = PhraseSpan(last.text, last.start_ms, last.end_ms)

    async def _synthesize(self, phrase: str) -> AsyncIterator[np.ndarray]:
        """The phrase's audio at the output rate, synthesized in a worker thread (voice.tts_stream)."""
        assert self.voice is not None
        tts = self.voice.tts
        memo = self.phrase_cache
        key = None if memo is None else memo.key(phrase, tts, self.voice.speaker, self.speaking_rate, self.output_sample_rate)
        if memo is not None and key is not None and (cached := memo.get(key)) is not None:
            for chunk in cached:
                if self.trace is not None:
                    self.trace.mark("tts_first_audio")
                yield chunk
            return
        made: list[np.ndarray] = []
        first = len(self.spans) == 1
        chunks = synthesize_async(
            tts, phrase, rate=self.speaking_rate, voice=self.voice.speaker, work=self.tts_work, name=f"tts-turn{self.turn_id}",
            runner=self.runner, priority=Priority.WAITED if first else Priority.NEXT, key=self.key,
            on_wait=self._first_wait if first else lambda ms: None,
        )  # fmt: skip
        async with aclosing(chunks):
            async for chunk in chunks:
                if self.trace is not None:
                    self.trace.mark("tts_first_audio")
                out = resample(chunk, tts.sample_rate, self.output_sample_rate)
                if memo is not None:
                    made.append(out)
                yield out
        if memo is not None and key is not None:
            memo.put(key, made)  # reached only when the synthesis ran to its end

    def _first_wait(self, wait_ms: float) -> None:
        if self.trace is not None:
            self.trace.info.setdefault("queue_ms", {})["tts"] = round(wait_ms, 3)

    async def _send_audio(self, audio: np.ndarray) -> None:
        piece = max(1, int(self.output_sample_rate * AUDIO_PIECE_MS / 1000))
        for i in range(0, len(audio), piece):
            part = audio[i : i + piece]
            await self._pace()
            part_ms = 1000.0 * len(part) / self.output_sample_rate
            self.queued_ms += part_ms
            await self.outbox.send_audio(self.turn_id, float_to_pcm16(part), self._on_sent(part_ms))

    def mark_played(self, played_ms: float) -> None:
        """The client's playback mark: where its playback is now (pacing goes by it from here on)."""
        self.played_ms = played_ms
        if played_ms > 0:  # a mark of progress (many clients only say when playback starts: paced by the clock)
            self._mark = (played_ms, self.clock())
            self._marked.set()

    def playback_ms(self) -> float | None:
        """Where the client's playback can be now: from its latest mark of progress, carried on at real time for at
        most MARK_CARRY_S (a client that stops marking, or stops playing, is not played ahead of); before any, from
        the first audio sent, at real time. None before any audio was sent."""
        now = self.clock()
        if self._mark is not None:
            played_ms, at_s = self._mark
            return played_ms + 1000.0 * min(max(0.0, now - at_s), MARK_CARRY_S)
        if self._first_sent_s is None:
            return None
        return 1000.0 * (now - self._first_sent_s)

    async def _pace(self) -> None:
        """Keep at most `audio_lead_ms` of audio ahead of where playback can be (playback_ms). This also paces the
        synthesis: a later phrase starts only once the one before is all queued, so a reply nobody is playing is
        not synthesised ahead, and its cores go to someone else's first phrase."""
        while (position_ms := self.playback_ms()) is not None and (ahead_ms := self.queued_ms - position_ms) > self.audio_lead_ms:
            self._marked.clear()
            self.waiting_for_playback = True
            try:
                with suppress(TimeoutError):  # (asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel)
                    async with asyncio.timeout(min((ahead_ms - self.audio_lead_ms) / 1000.0, PACE_POLL_S)):
                        await self._marked.wait()
            finally:
                self.waiting_for_playback = False

    def _on_sent(self, part_ms: float) -> Callable[[], None]:
        def sent() -> None:
            if self._first_sent_s is None:
                self._first_sent_s = self.clock()
                if self.trace is not None:
                    self.trace.mark("first_audio_sent")
            self.sent_ms += part_ms

        return sent

    def spoken(self, upto_ms: float | None = None) -> str:
        """What the user heard of the first `upto_ms` of the reply; by default as far as the client's latest
        playback mark, else as far as the audio written to the socket."""
        if upto_ms is None:
            upto_ms = self.sent_ms if self.played_ms is None else self.played_ms
        return spoken_text(self.spans, upto_ms)
