"""A scripted Parley server for the desktop client's tests: protocol v1 over websockets, no models.

An energy detector stands in for VAD; every user turn is answered with a fixed text and a tone at
22.05 kHz sent faster than real time, so the client's jitter buffer and clear() have work to do.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from web.protocol import encode, pack_audio

OUT_RATE = 22050
REPLY_TEXT = "Hello there, this is the mock."


def tone(seconds: float, hz: float = 440.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * OUT_RATE)) / OUT_RATE
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)


@dataclass
class MockState:
    token: str | None = None
    token_refusal: str = "message"  # "message": error + close 1008 like web/ws.py; "http": a 401 handshake
    reply_s: float = 2.0
    personas: tuple[str, ...] = ("assistant", "concise", "storyteller")
    sessions: int = 0
    audio_bytes: int = 0
    speech_starts: int = 0  # times the energy detector heard speech begin
    marks: list[tuple[int, float]] = field(default_factory=list)
    cancels: int = 0
    texts: list[str] = field(default_factory=list)
    starts: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)


class _Session:
    def __init__(self, ws: Any, state: MockState) -> None:
        self.ws, self.state = ws, state
        self.persona, self.voice = "assistant", "joe"
        self.turn_id = 0
        self.reply: asyncio.Task[None] | None = None
        self.voiced_ms = self.silent_ms = 0.0
        self.in_speech = False
        self.heard_ms = 0.0

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send(encode(kind, **fields))

    async def ready(self) -> None:
        await self.send("session.ready", session_id=f"s{self.state.sessions}", protocol=1, input_sample_rate=16000,
                        output_sample_rate=OUT_RATE, persona=self.persona, voice=self.voice,
                        personas=[{"name": p, "display_name": p.title(), "voice": "joe"} for p in self.state.personas],
                        voices=[{"name": "joe", "backend": "piper", "description": ""}])

    async def on_audio(self, data: bytes) -> None:
        self.state.audio_bytes += len(data)
        pcm = np.frombuffer(data, "<i2").astype(np.float32) / 32768
        ms = len(pcm) / 16
        self.heard_ms += ms
        loud = float(np.sqrt(np.mean(pcm ** 2))) > 0.02 if len(pcm) else False
        if loud:
            self.voiced_ms += ms
            self.silent_ms = 0.0
            if not self.in_speech and self.voiced_ms >= 100:
                self.in_speech = True
                self.state.speech_starts += 1
                await self.send("vad.speech_started", turn_id=self.turn_id + 1, t_ms=self.heard_ms)
                await self.cancel_reply()
        else:
            self.silent_ms += ms
            if self.silent_ms >= 60:
                self.voiced_ms = 0.0
            if self.in_speech and self.silent_ms >= 300:
                self.in_speech = False
                await self.send("vad.speech_ended", turn_id=self.turn_id + 1, t_ms=self.heard_ms - self.silent_ms)
                self.turn_id += 1
                await self.send("transcript.partial", turn_id=self.turn_id, text="hel")
                await self.send("transcript.final", turn_id=self.turn_id, text="hello")
                self.reply = asyncio.create_task(self.respond(self.turn_id))

    async def cancel_reply(self) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reply
            await self.send("response.audio.clear", turn_id=self.turn_id)
            await self.send("response.done", turn_id=self.turn_id, text=REPLY_TEXT, interrupted=True, spoken_text="Hello")

    async def respond(self, turn_id: int) -> None:
        await self.send("response.text.delta", turn_id=turn_id, text=f"[{self.persona}] ")
        await self.send("response.text.delta", turn_id=turn_id, text=REPLY_TEXT)
        audio = (tone(self.state.reply_s) * 32767).astype("<i2").tobytes()
        chunk = OUT_RATE // 10 * 2  # 100 ms
        for seq, i in enumerate(range(0, len(audio), chunk)):
            await self.ws.send(pack_audio(turn_id, seq, audio[i:i + chunk]))
            await asyncio.sleep(0.05)  # twice real time
        await self.send("response.done", turn_id=turn_id, text=REPLY_TEXT, interrupted=False, spoken_text=REPLY_TEXT)
        stages = {"endpointing": 300.0, "asr": 120.0, "llm_ttft": 90.0, "phrase": 150.0, "tts": 200.0, "send": 2.0,
                  "voice_to_voice": 862.0}
        await self.send("turn.trace", turn_id=turn_id, marks_ms={}, stages_ms=stages,
                        budgets_ms={"voice_to_voice": 800.0, "asr": 300.0}, over_budget=["voice_to_voice"])

    async def on_text(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "session.update":
            self.state.updates.append(msg)
            self.persona = msg.get("persona") or self.persona
            self.voice = msg.get("voice") or self.voice
            await self.ws.send(json.dumps({"type": "session.updated", "persona": self.persona, "voice": self.voice}))
        elif kind == "playback.mark":
            self.state.marks.append((msg["turn_id"], msg["played_ms"]))
        elif kind == "response.cancel":
            self.state.cancels += 1
            await self.cancel_reply()
        elif kind == "input.text":
            self.state.texts.append(msg["text"])
            self.turn_id += 1
            self.reply = asyncio.create_task(self.respond(self.turn_id))


async def _handler(ws: Any, state: MockState) -> None:
    if state.token and ws.request.headers.get("Authorization") != f"Bearer {state.token}":
        # like web/ws.py: accept, say why, close with 1008 (policy)
        await ws.send(encode("error", code="unauthorized", message="missing or wrong token", fatal=True))
        await ws.close(1008)
        return
    start = json.loads(await ws.recv())
    state.starts.append(start)
    state.sessions += 1
    session = _Session(ws, state)
    session.persona = start.get("persona") or session.persona
    await session.ready()
    try:
        async for raw in ws:
            if isinstance(raw, bytes):
                await session.on_audio(raw)
            else:
                await session.on_text(json.loads(raw))
    finally:
        if session.reply is not None:
            session.reply.cancel()


async def start_mock(state: MockState, port: int = 0) -> Any:
    """Serve on 127.0.0.1; returns the websockets server (its port in .sockets[0])."""
    from websockets.asyncio.server import serve
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    def check_token(conn: Any, request: Any) -> Response | None:
        if state.token and state.token_refusal == "http" and request.headers.get("Authorization") != f"Bearer {state.token}":
            return Response(401, "Unauthorized", Headers(), b"bad token\n")
        return None

    return await serve(lambda ws: _handler(ws, state), "127.0.0.1", port, process_request=check_token,
                       compression=None)


def port_of(server: Any) -> int:
    return int(server.sockets[0].getsockname()[1])
