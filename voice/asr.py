"""Speech recognition: a `Transcriber` protocol, the faster-whisper backend with hallucination guards,
and `StreamingTranscriber`, the async shell that turns re-decodes into stable partials and a final.

It knows 16 kHz float32 utterances and text; it does not know VAD, sockets or turns.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from voice.agreement import LocalAgreement
from voice.audio import SAMPLE_RATE
from voice.scheduler import DirectRunner, Skipped, StageRunner
from voice.stage_queue import Priority


@dataclass(frozen=True)
class Transcript:
    text: str  # "" when nothing trustworthy was heard
    no_speech_prob: float  # highest over the kept segments; 1.0 when none was kept
    avg_logprob: float  # mean over the kept segments; 0.0 when none was kept
    audio_ms: float  # length of the audio decoded
    decode_ms: float  # wall time of the decode
    queue_ms: float = 0.0  # time it waited for a worker of the shared-stage scheduler (voice.scheduler)


class Transcriber(Protocol):
    streams_partials: bool  # partial transcripts while the user speaks (a remote recogniser: finals only)
    # several sessions' finals decoded as one batch, where the recogniser can (None: one at a time)
    transcribe_batch: Callable[[list[np.ndarray]], list[Transcript]] | None

    def transcribe(self, audio: np.ndarray) -> Transcript:
        """Decode a whole utterance: float32 [N] at 16 kHz. Synchronous; call it from a worker thread."""
        ...


# Whisper's classic inventions on silence and noise (learned from subtitles); only dropped when
# the segment also looks unsure, so a user who really says "thank you" is still heard.
_SILENCE_HALLUCINATIONS = frozenset(
    {"thank you", "thanks for watching", "thank you for watching", "you", "bye", "so", "okay", "oh"}
)


# Whisper's encoder always runs over a 30 s window (3000 mel frames), most of it padding for a spoken request,
# and on this CPU that is ~170 of the ~250 ms a 3 s utterance takes. A window fitted to the audio (+1 s, at least
# 10 s) encodes in ~20 ms; measured on 88 corpus clips (Piper, flite slt/kal, espeak) WER 0.079 against 0.073 for
# the full window, and 0.13 with a 5 s window. The decode is capped at 6 tokens a second of audio, so a window
# whose end the decoder does not expect cannot loop.
FIT_MIN_FRAMES = 1000
FIT_MAX_FRAMES = 3000
FIT_TOKENS_PER_S = 6.0
# A fitted window's decoder now and then ends the text early: "Your shopping list now has milk." for ~5 s of
# speech that goes on "bread and eggs on it. Is there anything else you need?" (1 in 15 noisy Piper takes of
# that reply; the full window, 0 in 75). Slower than 1.5 words a second over 3 s or more of speech (slow
# speech is ~2 words a second; the corpus' slowest take 2.06) is taken as cut short and decoded again in full.
FIT_MIN_WORDS_PER_S = 1.5
FIT_CHECK_MIN_S = 3.0
_MAX_COMPRESSION = 2.4  # faster-whisper's own threshold for repetitive (hallucinated) text


def cut_repeat(text: str, min_words: int = 3) -> str:
    """`text` up to where a run of `min_words` or more words starts to come again right after itself. A short
    window's decoder can transcribe the speech and then start over ("Tell me a joke about cats Tell me a joke
    about cats Tell me..."); people hardly ever repeat three words back to back."""
    raw = text.split()
    words = ["".join(c for c in w.lower() if c.isalnum()) for w in raw]
    for end in range(2 * min_words, len(words) + 1):  # the earliest repeat to complete wins
        for n in range(min_words, end // 2 + 1):
            if words[end - 2 * n : end - n] == words[end - n : end]:
                return " ".join(raw[: end - n])
    return text


def cut_short(text: str, speech_s: float) -> bool:
    """Whether `text` is too few words for `speech_s` seconds of speech: a decode that stopped early."""
    return speech_s >= FIT_CHECK_MIN_S and len(text.split()) < FIT_MIN_WORDS_PER_S * speech_s


class WhisperTranscriber:
    """faster-whisper over a CTranslate2 Whisper folder (e.g. the embedded tiny.en).

    `fitted_window` (the default): an utterance of up to ~29 s is encoded over a window fitted to it rather than
    Whisper's 30 s (see FIT_MIN_FRAMES): ~70 instead of ~250 ms for a spoken request. Longer audio, a decode that
    hit its token cap, came out repetitive or stopped early (`cut_short`), and multilingual models without a set
    language take faster-whisper's own transcribe().

    Guards against text invented from silence or noise, in three layers:
    1. faster-whisper's own Silero VAD filter (`vad_filter`): audio with no speech decodes to nothing;
    2. per segment: dropped when no_speech_prob > `no_speech_threshold` and avg_logprob is below
       `log_prob_threshold` (Whisper's own rule), or when avg_logprob < `min_avg_logprob`;
    3. a known silence hallucination ("thank you", "you") is dropped unless the model is sure of it.
    The lazy segment generator is consumed here, so callers in a worker thread get finished text.
    """

    streams_partials = True

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        compute_type: str = "int8_float32",
        beam_size: int = 1,
        *,
        language: str | None = "en",
        vad_filter: bool = True,
        no_speech_threshold: float = 0.6,
        log_prob_threshold: float = -1.0,
        min_avg_logprob: float = -1.5,
        cpu_threads: int = 0,
        fitted_window: bool = True,
    ) -> None:
        from faster_whisper import WhisperModel  # lazy: loads ctranslate2 and onnxruntime
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self._model = WhisperModel(str(model_path), device=device, compute_type=compute_type, cpu_threads=cpu_threads)
        self.beam_size = beam_size
        self.language = language
        self.vad_filter = vad_filter
        self.no_speech_threshold = no_speech_threshold
        self.log_prob_threshold = log_prob_threshold
        self.min_avg_logprob = min_avg_logprob
        multilingual = self._model.model.is_multilingual
        self.fitted_window = fitted_window and (language is not None or not multilingual)
        self._tokenizer = Tokenizer(self._model.hf_tokenizer, multilingual, task="transcribe", language=language or "en")
        self._prompt = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        self._suppress = list(get_suppressed_tokens(self._tokenizer, [-1]))

    def transcribe(self, audio: np.ndarray) -> Transcript:
        audio = np.asarray(audio, dtype=np.float32)  # [N] at 16 kHz
        audio_ms = 1000.0 * len(audio) / SAMPLE_RATE
        t0 = time.perf_counter()
        if len(audio) < SAMPLE_RATE // 10:  # under 100 ms there is no word to hear
            return Transcript("", 1.0, 0.0, audio_ms, 0.0)
        fits = self.fitted_window and len(audio) < (FIT_MAX_FRAMES - 100) * SAMPLE_RATE // 100
        fitted = self._decode_fitted(audio) if fits else None
        if fitted is not None:
            kept = [fitted] if self._trustworthy(fitted) else []
        else:
            kept = self._decode_full(audio)
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

    def transcribe_batch(self, audios: list[np.ndarray]) -> list[Transcript]:
        """Several utterances (e.g. different sessions' finals waiting at once) in one encoder and one decoder
        batch over the widest of their fitted windows, faster than one at a time (bench/stages.py --asr-batch;
        docs/benchmarks.md). Any the batch cannot trust is decoded alone after."""
        t0 = time.perf_counter()
        audios = [np.asarray(a, dtype=np.float32) for a in audios]
        fits = [self.fitted_window and SAMPLE_RATE // 10 <= len(a) < (FIT_MAX_FRAMES - 100) * SAMPLE_RATE // 100 for a in audios]
        fitted = self._decode_fitted_many([a for a, f in zip(audios, fits) if f]) if sum(fits) > 1 else []
        batch_ms = 1000.0 * (time.perf_counter() - t0)
        out: list[Transcript] = []
        for audio, fit in zip(audios, fits):
            seg = fitted.pop(0) if fit and sum(fits) > 1 else None
            if seg is None:
                out.append(self.transcribe(audio))
                continue
            audio_ms = 1000.0 * len(audio) / SAMPLE_RATE
            if not self._trustworthy(seg):
                out.append(Transcript("", 1.0, 0.0, audio_ms, batch_ms))
                continue
            out.append(Transcript(seg.text.strip(), float(seg.no_speech_prob), float(seg.avg_logprob), audio_ms, batch_ms))
        return out

    def _decode_fitted(self, audio: np.ndarray) -> SimpleNamespace | None:
        """One segment decoded over a window fitted to the audio; None when the full decode should do it."""
        return self._decode_fitted_many([audio])[0]

    def _decode_fitted_many(self, audios: list[np.ndarray]) -> list[SimpleNamespace | None]:
        """Each utterance's one segment, decoded together over the window that fits the longest; None for one the
        full decode should do."""
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.transcribe import get_compression_ratio
        from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

        out: list[SimpleNamespace | None] = [None] * len(audios)
        speech: list[tuple[int, np.ndarray]] = []
        for i, audio in enumerate(audios):
            if self.vad_filter:  # as faster-whisper's own transcribe does: the speech alone, joined
                chunks = get_speech_timestamps(audio, VadOptions())
                if not chunks:
                    out[i] = SimpleNamespace(text="", no_speech_prob=1.0, avg_logprob=0.0)
                    continue
                audio = np.concatenate(collect_chunks(audio, chunks)[0])
            speech.append((i, audio))
        if not speech:
            return out
        features = [self._model.feature_extractor(a)[:, :-1] for _, a in speech]  # [80, frames] each
        window = max(FIT_MIN_FRAMES, -(-(max(f.shape[1] for f in features) + 100) // 100) * 100)
        if window > FIT_MAX_FRAMES:
            return out
        encoded = self._model.encode(np.stack([pad_or_trim(f, window) for f in features]))  # [B, 80, window] in
        caps = [4 + int(FIT_TOKENS_PER_S * len(a) / SAMPLE_RATE) for _, a in speech]
        # CTranslate2 stops a Whisper decode at about max_length / 2 new tokens (measured): twice the cap, so a
        # decode that reaches the cap is one that ran away, not one the limit cut short
        max_length = min(len(self._prompt) + 2 * max(caps) + 2, self._model.max_length)
        results = self._model.model.generate(
            encoded, [self._prompt] * len(speech), beam_size=self.beam_size, max_length=max_length,
            return_scores=True, return_no_speech_prob=True, suppress_blank=True, suppress_tokens=self._suppress,
        )  # fmt: skip
        for (i, audio), cap, result in zip(speech, caps, results):
            tokens = result.sequences_ids[0]
            full_text = self._tokenizer.decode(tokens).strip()
            text = cut_repeat(full_text)
            if (len(tokens) >= cap and text == full_text) or get_compression_ratio(text) > _MAX_COMPRESSION:
                continue  # ran on without repeating itself, or repetitive within: not to be trusted
            if cut_short(text, len(audio) / SAMPLE_RATE):
                continue
            avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)  # as faster-whisper computes it
            out[i] = SimpleNamespace(text=text, no_speech_prob=float(result.no_speech_prob), avg_logprob=float(avg_logprob))
        return out

    def _decode_full(self, audio: np.ndarray) -> list[Any]:
        """faster-whisper's transcribe over 30 s windows; the trustworthy segments."""
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
        return [s for s in list(segments) if self._trustworthy(s)]  # list(): decode happens here, in this thread

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
    what the user waits for). Decodes run on `runner` (the shared-stage scheduler: partials last, finals first,
    under `key`, the session), never on the event loop.
    """

    def __init__(
        self,
        transcriber: Transcriber,
        partial_interval_ms: int = 500,
        *,
        min_partial_audio_ms: int = 500,
        agreement_n: int = 2,
        runner: StageRunner | None = None,
        key: str = "",
    ) -> None:
        self._transcriber = transcriber
        self._runner: StageRunner = runner or DirectRunner()
        self._key = key
        self._partials = transcriber.streams_partials  # a remote recogniser hears finals only
        self.partial_interval_ms = partial_interval_ms
        self.min_partial_audio_ms = min_partial_audio_ms
        self._agreement = LocalAgreement(agreement_n)
        self._lock = asyncio.Lock()
        self.reset()

    def reset(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._decoded_samples = 0  # audio length at the last partial decode
        self.hypothesis = ""  # the last partial decode's whole text (committed or not): the best guess so far
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

    def partial_due(self, interval_ms: int | None = None) -> bool:
        """Whether `interval_ms` (default `partial_interval_ms`) of new audio came since the last partial decode."""
        if not self._partials:
            return False
        new_ms = 1000.0 * (self._samples - self._decoded_samples) / SAMPLE_RATE
        due_ms = self.partial_interval_ms if interval_ms is None else interval_ms
        return self.audio_ms >= self.min_partial_audio_ms and new_ms >= due_ms

    async def partial(self) -> str | None:
        if not self.partial_due() or self._lock.locked():
            return None  # a decode is already running; the next call picks up the new audio
        async with self._lock:
            audio = self.audio()
            self._decoded_samples = len(audio)
            try:
                ran = await self._runner.run("asr", Priority.PARTIAL, self._key, self._transcriber.transcribe, audio)
            except Skipped:  # the machine is behind: this partial is dropped, a later one covers its audio
                return None
            transcript = ran.value
        self.hypothesis = transcript.text.strip()
        if self._agreement.update(transcript.text) is None:
            return None
        return self._agreement.committed

    def final(self) -> Coroutine[Any, Any, Transcript]:
        """Awaitable final of the audio appended so far. The audio is taken at the call, not when the
        coroutine first runs, so `create_task(st.final())` fixes the utterance at SpeechPaused."""
        return self._decode_final(self.audio())

    async def _decode_final(self, audio: np.ndarray) -> Transcript:
        batch = self._transcriber.transcribe_batch  # finals of several sessions waiting at once
        ran = await self._runner.run("asr", Priority.WAITED, self._key, self._transcriber.transcribe, audio, batch=batch)
        return replace(ran.value, queue_ms=round(ran.wait_ms, 3))
