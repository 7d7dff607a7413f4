"""POST /v1/audio/transcriptions (the loaded Whisper) and POST /v1/audio/speech (the configured voices, streamed).

Uploads are decoded by libsndfile (WAV, FLAC, Ogg), else PyAV (any container), to 16 kHz mono. Speech
is 24 kHz 16-bit mono, as OpenAI's `pcm` is, so its clients play it unchanged; `wav` adds a streaming header.
OpenAI's voice names map to configured voices (server.openai_voices); a configured voice's own name works too.
"""
from __future__ import annotations

import asyncio
import io
import struct
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import aclosing
from typing import Any

import numpy as np
import soundfile as sf
from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from voice.audio import float_to_pcm16, resample
from voice.reply import VoiceBinding, WorkCounter
from voice.tts_stream import synthesize_async
from web.openai_api.schema import ApiError, SpeechRequest, require_stage
from web.protocol import clip
from parley.runtime import Runtime

SPEECH_RATE = 24000
MAX_UPLOAD_BYTES = 25 * 2**20  # OpenAI's limit
MAX_UPLOAD_S = 600.0


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header whose sizes say "unknown" (0xFFFFFFFF), for audio streamed as it is made."""
    unknown = 0xFFFFFFFF
    return b"RIFF" + struct.pack("<I", unknown) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + \
        b"data" + struct.pack("<I", unknown)  # fmt: skip


def decode_upload(data: bytes) -> np.ndarray:
    """16 kHz mono float32 from an uploaded file: WAV, FLAC and Ogg through libsndfile (~1 ms); anything else
    (mp3, m4a, webm) through PyAV, as faster-whisper decodes (~100 ms even for a short clip: not the usual path)."""
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        audio = resample(audio.mean(axis=1), int(rate), 16000)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        audio = _decode_av(data)
    if len(audio) > MAX_UPLOAD_S * 16000:
        raise ApiError(400, f"file: longer than {MAX_UPLOAD_S:.0f} s", param="file")
    return np.asarray(audio, dtype=np.float32)


def _decode_av(data: bytes) -> np.ndarray:
    from faster_whisper import decode_audio

    try:
        return np.asarray(decode_audio(io.BytesIO(data), sampling_rate=16000), dtype=np.float32)
    except Exception as exc:  # noqa: BLE001 - PyAV's errors are many; each is the client's file
        raise ApiError(400, f"file: cannot decode the audio ({type(exc).__name__})", param="file") from None


def router(runtime: Callable[[], Runtime], aliases: Mapping[str, str], served: Collection[str]) -> APIRouter:
    """served: the stages this process serves (transcriptions need `asr`, speech `tts`)."""
    api = APIRouter()

    @api.post("/v1/audio/transcriptions", response_model=None)
    async def transcriptions(
        file: UploadFile = File(...), model: str = Form(""), response_format: str = Form("json"),
        language: str | None = Form(None), prompt: str | None = Form(None), temperature: float = Form(0.0),
    ) -> JSONResponse | PlainTextResponse:  # fmt: skip
        require_stage(served, "asr")
        if response_format not in ("json", "text", "verbose_json"):
            raise ApiError(400, "response_format: one of json, text, verbose_json", param="response_format")
        data = await file.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"file: larger than {MAX_UPLOAD_BYTES // 2**20} MB", param="file")
        audio = await asyncio.to_thread(decode_upload, data)
        try:
            t = await asyncio.to_thread(runtime().stages.transcriber.transcribe, audio)
        except (OSError, RuntimeError, ValueError) as exc:  # e.g. this server's own recogniser is remote and down
            raise ApiError(502, f"transcription failed: {exc}", type="server_error") from None
        if response_format == "text":
            return PlainTextResponse(t.text)
        body: dict[str, Any] = {"text": t.text}
        if response_format == "verbose_json":
            duration = len(audio) / 16000
            body = {"task": "transcribe", "language": language or "english", "duration": duration, "text": t.text,
                    "segments": [{"id": 0, "seek": 0, "start": 0.0, "end": duration, "text": t.text, "tokens": [],
                                  "temperature": 0.0, "avg_logprob": t.avg_logprob, "compression_ratio": 0.0,
                                  "no_speech_prob": t.no_speech_prob}] if t.text else []}  # fmt: skip
        return JSONResponse(body)

    @api.post("/v1/audio/speech")
    async def speech(body: SpeechRequest) -> StreamingResponse:
        require_stage(served, "tts")
        stages = runtime().stages
        voices = stages.voices
        name = body.voice_name()
        name = aliases.get(name, name)
        if name not in voices:
            known = sorted({*voices, *aliases})
            raise ApiError(400, f"voice: unknown voice {clip(body.voice_name())} (known: {', '.join(known)})", param="voice")
        media = "audio/wav" if body.response_format == "wav" else "audio/pcm"
        return StreamingResponse(_speak(voices[name], body, stages.tts_work), media_type=media)

    return api


async def _speak(binding: VoiceBinding, body: SpeechRequest, work: WorkCounter) -> AsyncIterator[bytes]:
    if body.response_format == "wav":
        yield wav_header(SPEECH_RATE)
    tts = binding.tts
    chunks = synthesize_async(tts, body.input, rate=body.speed, voice=binding.speaker, work=work, name="tts-http")
    async with aclosing(chunks):  # the client went away: the worker stops at the next chunk
        async for chunk in chunks:
            yield float_to_pcm16(resample(chunk, tts.sample_rate, SPEECH_RATE))
