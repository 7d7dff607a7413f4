"""Speech recognition: a `Transcriber` protocol, the faster-whisper backend with hallucination guards,
and `StreamingTranscriber`, the async shell that turns re-decodes into stable partials and a final.

It knows 16 kHz float32 utterances and text; it does not know VAD, sockets or turns.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Coroutine
from typing import Any, Protocol

import numpy as np

from voice.agreement import LocalAgreement
from voice.audio import SAMPLE_RATE



@dataclass(frozen=True)
class Transcript:
    text: str  # "" when nothing trustworthy was heard
    no_speech_prob: float  # highest over the kept segments; 1.0 when none was kept
    avg_logprob: float  # mean over the kept segments; 0.0 when none was kept
    audio_ms: float  # length of the audio decoded
    decode_ms: float  # wall time of the decode


class Transcriber(Protocol):
    def transcribe(self, audio: np.ndarray) -> Transcript:
        """Decode a whole utterance: float32 [N] at 16 kHz. Synchronous; call it from a worker thread."""
        ...


# Whisper's classic inventions on silence and noise (learned from subtitles); only dropped when
# the segment also looks unsure, so a user who really says "thank you" is still heard.
_SILENCE_HALLUCINATIONS = frozenset(
    {"thank you", "thanks for watching", "thank you for watching", "you", "bye", "so", "okay", "oh"}
)


class WhisperTranscriber:
    """faster-whisper over a CTranslate2 Whisper folder (e.g. the embedded tiny.en).

    Guards against text invented from silence or noise, in three layers:
    1. faster-whisper's own Silero VAD filter (`vad_filter`): audio with no speech decodes to nothing;
    2. per segment: dropped when no_speech_prob > `no_speech_threshold` and avg_logprob is below
       `log_prob_threshold` (Whisper's own rule), or when avg_logprob < `min_avg_logprob`;
    3. a known silence hallucination ("thank you", "you") is dropped unless the model is sure of it.
    The lazy segment generator is consumed here, so callers in a worker thread get finished text.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        compute_type: str = "int8",
        beam_size: int = 1,
        *,
        language: str | None = "en",
        vad_filter: bool = True,
        no_speech_threshold: float = 0.6,
        log_prob_threshold: float = -1.0,
        min_avg_logprob: float = -1.5,
        cpu_threads: int = 0,
    ) -> None:
        from faster_whisper import WhisperModel  # lazy: loads ctranslate2 and onnxruntime

        self._model = WhisperModel(str(model_path), device=device, compute_type=compute_type, cpu_threads=cpu_threads)
        self.beam_size = beam_size
        self.language = language
        self.vad_filter = vad_filter
        self.no_speech_threshold = no_speech_threshold
        self.log_prob_threshold = log_prob_threshold
        self.min_avg_logprob = min_avg_logprob

    def transcribe(self, audio: np.ndarray) -> Transcript:
        audio = np.asarray(audio, dtype=np.float32)  # [N] at 16 kHz
        audio_ms = 1000.0 * len(audio) / SAMPLE_RATE
        t0 = time.perf_counter()
        if len(audio) < SAMPLE_RATE // 10:  # under 100 ms there is no word to hear
            return Transcript("", 1.0, 0.0, audio_ms, 0.0)
        segments, _info = self._model.transcribe(
            audio,
            language=self.language,
            beam_size=self.beam_size,
            temperature=0.0,  # no sampling fallback: the retries cost time and invent text on noise
            condition_on_previous_text=False,  # an earlier mistake must not seed the next segment
            without_timestamps=True,
            word_timestamps=False,
            vad_filter=self.vad_filter,
            no_speech_threshold=self.no_speech_threshold,
            log_prob_threshold=self.log_prob_threshold,
        )
        kept = [s for s in list(segments) if self._trustworthy(s)]  # list(): decode happens here, in this thread
        decode_ms = 1000.0 * (time.perf_counter() - t0)
        if not kept:
            return Transcript("", 1.0, 0.0, audio_ms, decode_ms)
        text = " ".join(s.text.strip() for s in kept).strip()
        return Transcript(
            text=text,
            no_speech_prob=max(float(s.no_speech_prob) for s in kept),
            avg_logprob=float(np.mean([s.avg_logprob for s in kept])),
            audio_ms=audio_ms,
            decode_ms=decode_ms,
        )

    def _trustworthy(self, segment: Any) -> bool:
        text = segment.text.strip()
        if not text:
            return False
        if segment.no_speech_prob > self.no_speech_threshold and segment.avg_logprob < self.log_prob_threshold:
            return False
        if segment.avg_logprob < self.min_avg_logprob:
            return False
        plain = "".join(c for c in text.lower() if c.isalnum() or c == " ").strip()
        if plain in _SILENCE_HALLUCINATIONS and (segment.no_speech_prob > 0.3 or segment.avg_logprob < -0.7):
            return False
        return True


class StreamingTranscriber:
    """Async shell over a `Transcriber` and `LocalAgreement`: stable partials while the user speaks,
    a full-utterance final at the end. One per utterance, or `reset()` between utterances.

    - `append(audio)`: add 16 kHz float32 samples of the current utterance (cheap, no decode).
    - `await partial()`: when at least `partial_interval_ms` of new audio arrived since the last
      decode, re-decode the whole utterance so far in a worker thread and run LocalAgreement-2 over
      consecutive hypotheses; returns the full committed text when it grew, else None. Committed
      text only ever grows (see `committed`).
    - `await final()`: decode the whole utterance as it is at the call. To finish recognition before
      the turn ends, start it at the pause (`task = asyncio.create_task(st.final())`), cancel the task
      if speech resumes, and await it at the endpoint: audio after the pause is silence, so leaving it
      out changes nothing. The final is exactly an offline decode of that audio.
    Partials never overlap each other (a lock); a final does not wait for a partial in flight (the final is
    what the user waits for). None runs on the event loop.
    """

    def __init__(
        self,
        transcriber: Transcriber,
        partial_interval_ms: int = 500,
        *,
        min_partial_audio_ms: int = 500,
        agreement_n: int = 2,
    ) -> None:
        self._transcriber = transcriber
        self.partial_interval_ms = partial_interval_ms
        self.min_partial_audio_ms = min_partial_audio_ms
        self._agreement = LocalAgreement(agreement_n)
        self._lock = asyncio.Lock()
        self.reset()

    def reset(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._decoded_samples = 0  # audio length at the last partial decode
        self._agreement.reset()

    @property
    def audio_ms(self) -> float:
        return 1000.0 * self._samples / SAMPLE_RATE

    @property
    def committed(self) -> str:
        return self._agreement.committed

    def append(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono float32 [N], got shape {audio.shape}")
        self._chunks.append(audio)
        self._samples += len(audio)

    def audio(self) -> np.ndarray:
        """The utterance so far, float32 [N] at 16 kHz."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, dtype=np.float32)

    def partial_due(self) -> bool:
        new_ms = 1000.0 * (self._samples - self._decoded_samples) / SAMPLE_RATE
        return self.audio_ms >= self.min_partial_audio_ms and new_ms >= self.partial_interval_ms

    async def partial(self) -> str | None:
        if not self.partial_due() or self._lock.locked():
            return None  # a decode is already running; the next call picks up the new audio
        async with self._lock:
            audio = self.audio()
            self._decoded_samples = len(audio)
            transcript = await asyncio.to_thread(self._transcriber.transcribe, audio)
        if self._agreement.update(transcript.text) is None:
            return None
        return self._agreement.committed

    def final(self) -> Coroutine[Any, Any, Transcript]:
        """Awaitable final of the audio appended so far. The audio is taken at the call, not when the
        coroutine first runs, so `create_task(st.final())` fixes the utterance at SpeechPaused."""
        return self._decode_final(self.audio())

    async def _decode_final(self, audio: np.ndarray) -> Transcript:
        return await asyncio.to_thread(self._transcriber.transcribe, audio)
