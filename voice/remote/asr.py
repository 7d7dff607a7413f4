"""The recogniser over an OpenAI-compatible /v1/audio/transcriptions server, in the Transcriber shape.

Only final transcripts go over the wire (`streams_partials` is False): a partial every 500 ms per speaking
session would be most of the server's work, and turn-taking does not need them (it decodes the final at each
pause). The browser then shows the transcript when the turn ends rather than as it grows.
"""
from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
import soundfile as sf

from voice.asr import Transcript
from voice.audio import SAMPLE_RATE
from voice.remote.client import RemoteSpec, RemoteStageError, trace_headers


class RemoteTranscriber:
    streams_partials = False
    transcribe_batch = None  # each final is its own request: the server batches as it likes

    def __init__(self, spec: RemoteSpec) -> None:
        from openai import OpenAI  # lazy: only a remote stage needs the SDK loaded

        self.spec = spec
        # sync client: transcribe() runs in worker threads; httpx's client is safe to share between them
        self._client: Any = OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=1)

    def transcribe(self, audio: np.ndarray) -> Transcript:
        import openai

        audio = np.asarray(audio, dtype=np.float32)
        audio_ms = 1000.0 * len(audio) / SAMPLE_RATE
        t0 = time.perf_counter()
        if len(audio) < SAMPLE_RATE // 10:  # as the local recogniser: under 100 ms there is no word to hear
            return Transcript("", 1.0, 0.0, audio_ms, 0.0)
        buf = io.BytesIO()
        sf.write(buf, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
        try:
            result = self._client.audio.transcriptions.create(
                model=self.spec.model, file=("utterance.wav", buf.getvalue(), "audio/wav"), response_format="verbose_json",
                extra_headers=trace_headers(),  # this thread runs in the session's context (voice.scheduler)
            )  # fmt: skip
        except (openai.APIError, OSError) as exc:
            raise RemoteStageError(f"ASR server {self.spec.describe(exc)}") from None
        segments = getattr(result, "segments", None) or []
        text = (result.text or "").strip()
        no_speech = max((float(getattr(s, "no_speech_prob", 0.0)) for s in segments), default=0.0 if text else 1.0)
        logprob = float(np.mean([getattr(s, "avg_logprob", 0.0) for s in segments])) if segments else 0.0
        return Transcript(text, no_speech, logprob, audio_ms, 1000.0 * (time.perf_counter() - t0))
