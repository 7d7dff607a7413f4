"""Speech over an OpenAI-compatible /v1/audio/speech server, in the Tts shape: 24 kHz PCM, streamed.

The audio is read as the server sends it, so the first phrase starts playing before it is whole (when the server
streams: `parley stages`, Kokoro-FastAPI and speaches do).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from voice.audio import pcm16_to_float
from voice.remote.client import RemoteSpec, RemoteStageError, trace_headers

PCM_RATE = 24000  # what OpenAI's `pcm` format is
_READ_BYTES = 4800  # 100 ms


class RemoteTts:
    sample_rate = PCM_RATE

    def __init__(self, spec: RemoteSpec, default_voice: str = "alloy") -> None:
        from openai import OpenAI  # lazy: only a remote stage needs the SDK loaded

        self.spec = spec
        self.default_voice = default_voice
        self._client: Any = OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=1)

    def synthesize(self, text: str, *, rate: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        import openai

        if not 0.25 <= rate <= 4.0:
            raise ValueError(f"speaking rate {rate} is outside 0.25..4.0")
        try:
            with self._client.audio.speech.with_streaming_response.create(
                model=self.spec.model, voice=voice or self.default_voice, input=text, response_format="pcm", speed=rate,
                extra_headers=trace_headers(),  # this thread runs in the session's context (voice.scheduler)
            ) as response:  # fmt: skip
                rest = b""
                for data in response.iter_bytes(_READ_BYTES):
                    data, rest = rest + data, b""
                    if len(data) % 2:
                        data, rest = data[:-1], data[-1:]
                    if data:
                        yield pcm16_to_float(data)
        except (openai.APIError, OSError) as exc:
            raise RemoteStageError(f"TTS server {self.spec.describe(exc)}") from None
