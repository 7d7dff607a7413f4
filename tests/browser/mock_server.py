"""A stand-in Parley server speaking wire protocol v1 with canned events, for fast browser-client tests.

Energy VAD instead of models, a fixed transcript, a sine-wave reply paced a little faster than real
time. Knows nothing of the real server's internals; run: python -m tests.browser.mock_server PORT.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
IN_RATE = 16000
OUT_RATE = 22050
FRAME_MS = 20
PERSONAS = [
    {"name": "assistant", "display_name": "Parley", "voice": "joe", "greeting": "Hi, I'm Parley. What can I do for you?"},
    {"name": "storyteller", "display_name": "Storyteller", "voice": "kal", "greeting": "Hello there, traveller."},
]
VOICES = [{"name": "joe", "description": "Piper joe"}, {"name": "kal", "description": "flite kal"}]
BUDGETS = {"endpointing": 600, "asr": 300, "llm_ttft": 250, "phrase": 600, "tts": 400, "send": 50, "voice_to_voice": 1800}
CANNED_STAGES = {"endpointing": 410, "asr": 120, "llm_ttft": 90, "phrase": 310, "tts": 520, "send": 3, "voice_to_voice": 1453}


@dataclass
class MockOptions:
    transcript: str = "what is the weather like today"
    reply: str = "It is sunny with a light breeze."
    reply_s: float = 1.5
    max_sessions: int = 4
    voiced_rms: float = 0.01
    token: str | None = None
    greeting: str | None = None  # spoken at session start, as the real server does


@dataclass
class _Session:
    ws: WebSocket
    persona: str = "assistant"
    voice: str = "joe"
    turn_ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    reply: asyncio.Task | None = None
    reply_turn: int | None = None


def sine_pcm(seconds: float, freq: float = 220.0, rate: int = OUT_RATE) -> bytes:
    t = np.arange(int(seconds * rate)) / rate  # [N]
    wave = 0.3 * np.sin(2 * math.pi * freq * t) * np.minimum(1.0, t * 20)  # 50 ms fade-in, no click
    return (wave * 32767).astype("<i2").tobytes()


def create_app(opts: MockOptions) -> FastAPI:
    app = FastAPI()
    active: set[int] = set()

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True, "sessions": len(active)})

    async def send(s: _Session, msg: dict) -> None:
        await s.ws.send_text(json.dumps(msg))

    async def respond(s: _Session, turn_id: int, text: str) -> None:
        freq = 330.0 if s.voice == "kal" else 220.0  # the "voice" is audible in the pitch
        for word in text.split(" "):
            await send(s, {"type": "response.text.delta", "turn_id": turn_id, "text": word + " "})
        pcm = sine_pcm(opts.reply_s, freq)
        chunk = OUT_RATE // 10 * 2  # 100 ms of PCM16
        sent = 0
        try:
            for seq, start in enumerate(range(0, len(pcm), chunk)):
                await s.ws.send_bytes(struct.pack("<II", turn_id, seq) + pcm[start:start + chunk])
                sent += 1
                await asyncio.sleep(0.05)  # twice real time, like a TTS that keeps ahead
            await send(s, {"type": "response.done", "turn_id": turn_id, "text": text, "interrupted": False, "spoken_text": text})
            over = [k for k, v in CANNED_STAGES.items() if v > BUDGETS[k]]
            await send(s, {"type": "turn.trace", "turn_id": turn_id, "marks_ms": {}, "stages_ms": CANNED_STAGES,
                           "budgets_ms": BUDGETS, "over_budget": over})
        except asyncio.CancelledError:
            await send(s, {"type": "response.audio.clear", "turn_id": turn_id})
            await send(s, {"type": "response.done", "turn_id": turn_id, "text": text, "interrupted": True,
                           "spoken_text": " ".join(text.split()[: max(1, sent // 5)])})
            raise

    def start_reply(s: _Session, text: str) -> int:
        turn_id = next(s.turn_ids)
        s.reply_turn = turn_id
        s.reply = asyncio.create_task(respond(s, turn_id, text))
        return turn_id

    async def cancel_reply(s: _Session) -> None:
        if s.reply and not s.reply.done():
            s.reply.cancel()
            try:
                await s.reply
            except asyncio.CancelledError:
                pass

    @app.websocket("/ws")
    async def ws_endpoint(ws: WebSocket) -> None:
        await ws.accept()
        if opts.token and ws.query_params.get("token") != opts.token:
            await ws.send_text(json.dumps({"type": "error", "code": "unauthorized", "message": "wrong token", "fatal": True}))
            await ws.close(code=1008)
            return
        if len(active) >= opts.max_sessions:
            await ws.send_text(json.dumps({"type": "error", "code": "session_full", "message": "server full", "fatal": True}))
            await ws.close(code=1013)
            return
        s = _Session(ws)
        key = id(s)
        active.add(key)
        voiced_ms = silent_ms = 0
        speaking = False
        try:
            start = json.loads(await ws.receive_text())
            assert start["type"] == "session.start" and start["sample_rate"] == IN_RATE, start
            s.persona = start.get("persona") or s.persona
            s.voice = start.get("voice") or next(p["voice"] for p in PERSONAS if p["name"] == s.persona)
            await send(s, {"type": "session.ready", "session_id": f"mock-{key:x}", "protocol": 1, "input_sample_rate": IN_RATE,
                           "output_sample_rate": OUT_RATE, "persona": s.persona, "voice": s.voice,
                           "personas": PERSONAS, "voices": VOICES})
            if opts.greeting:
                start_reply(s, opts.greeting)
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("bytes") is not None:
                    pcm = np.frombuffer(msg["bytes"], dtype="<i2").astype(np.float32) / 32768  # [320]
                    voiced = float(np.sqrt(np.mean(pcm**2))) >= opts.voiced_rms
                    voiced_ms, silent_ms = (voiced_ms + FRAME_MS, 0) if voiced else (voiced_ms, silent_ms + FRAME_MS)
                    if not speaking and voiced_ms >= 100:
                        speaking = True
                        await send(s, {"type": "vad.speech_started", "turn_id": 1, "t_ms": 0})
                        await cancel_reply(s)
                        await send(s, {"type": "transcript.partial", "turn_id": 0, "text": opts.transcript.split()[0]})
                    elif speaking and silent_ms >= 400:
                        speaking = False
                        voiced_ms = 0
                        await send(s, {"type": "vad.speech_ended", "turn_id": 1, "t_ms": 0})
                        turn_id = start_reply(s, opts.reply)
                        await send(s, {"type": "transcript.final", "turn_id": turn_id, "text": opts.transcript})
                    elif not voiced and not speaking:
                        voiced_ms = 0
                    continue
                data = json.loads(msg["text"])
                kind = data.get("type")
                if kind == "input.text":
                    await cancel_reply(s)
                    start_reply(s, f"You said: {data['text']}.")
                elif kind == "response.cancel":
                    await cancel_reply(s)
                elif kind == "session.update":
                    await cancel_reply(s)
                    if data.get("persona"):
                        s.persona = data["persona"]
                        s.voice = next(p["voice"] for p in PERSONAS if p["name"] == s.persona)
                    s.voice = data.get("voice") or s.voice
                    await send(s, {"type": "session.updated", "persona": s.persona, "voice": s.voice})
                    start_reply(s, next(p["greeting"] for p in PERSONAS if p["name"] == s.persona))
                elif kind != "playback.mark":
                    await send(s, {"type": "error", "code": "bad_message", "message": f"unknown type {kind}", "fatal": False})
        except WebSocketDisconnect:
            pass
        finally:
            active.discard(key)
            if s.reply:
                s.reply.cancel()

    app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")  # as the real server does
    return app


def main(argv: list[str]) -> None:
    port = int(argv[0])
    opts = MockOptions(**json.loads(argv[1])) if len(argv) > 1 else MockOptions()
    print(f"Parley mock is listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(create_app(opts), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
