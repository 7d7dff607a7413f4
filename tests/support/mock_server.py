"""A stand-in Parley server speaking wire protocol v1 with canned behaviour and no models, for the clients' tests:
the browser page (run as a process that also serves web/static: `python -m tests.support.mock_server PORT [JSON]`)
and the desktop and benchmark clients (in process: `start_mock(state)`, whose state the test reads).

An energy detector stands in for the VAD; each user turn gets a fixed transcript and a reply of fixed text and a
sine tone (its pitch the voice's) paced at twice real time; a typed turn is echoed ("You said: ..."); a persona
switch greets in the new persona's voice. It records what the client sent. It knows nothing of the real server.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from web.protocol import pack_audio

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
IN_RATE = 16000
OUT_RATE = 22050
TRANSCRIPT = "what is the weather like today"
REPLY_TEXT = "It is sunny with a light breeze."
PERSONAS = [
    {"name": "assistant", "display_name": "Parley", "voice": "joe", "greeting": "Hi, I'm Parley. What can I do for you?"},
    {"name": "concise", "display_name": "Concise", "voice": "joe", "greeting": "Short answers, then."},
    {"name": "storyteller", "display_name": "Storyteller", "voice": "kal", "greeting": "Hello there, traveller."},
]
VOICES = [{"name": "joe", "description": "Piper joe"}, {"name": "kal", "description": "flite kal"}]
BUDGETS = {"endpointing": 600, "asr": 300, "llm_ttft": 250, "phrase": 600, "tts": 400, "send": 50, "voice_to_voice": 1800}
CANNED_STAGES = {"endpointing": 410, "asr": 120, "llm_ttft": 90, "phrase": 310, "tts": 520, "send": 3, "voice_to_voice": 1453}
# a voice turn that ended at the longest hold with its end-of-turn check still out (docs/protocol.md, Turn trace)
CANNED_TURN = {"end": "max_hangover", "checks": [{"silence_ms": 1000.0, "audio_prob": None, "text_prob": None, "complete_prob": None,
                                                  "wait_ms": None, "cost_ms": 864.0, "decision": "unanswered"}]}  # fmt: skip


@dataclass
class MockState:
    """Options (set before or while serving; the JSON a process is started with) and what the mock saw."""

    reply_s: float = 1.5  # seconds of tone per reply
    stall_after: int | None = None  # a reply's 100 ms chunks sent before its speech stalls (None: never)
    stall_s: float = 0.0  # for how long
    voiced_rms: float = 0.01  # the energy detector's threshold
    greeting: str | None = None  # spoken at session start, as the real server does
    max_sessions: int = 4
    token: str | None = None  # wanted as `Authorization: Bearer` or `?token=`
    token_refusal: str = "message"  # "message": accept, error, close 1008 (as web/ws.py does) | "http": a 401
    # what the mock saw
    sessions: int = 0  # sessions started
    starts: list[dict[str, Any]] = field(default_factory=list)  # their session.start messages
    updates: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # typed turns
    marks: list[tuple[int, float]] = field(default_factory=list)  # (turn, played_ms) of each playback.mark
    mark_bodies: list[dict[str, Any]] = field(default_factory=list)  # each playback.mark as sent
    cancels: int = 0
    audio_bytes: int = 0
    speech_starts: int = 0  # times the energy detector heard speech begin

    @classmethod
    def options(cls, raw: str) -> "MockState":
        return cls(**json.loads(raw)) if raw else cls()


@dataclass
class _Session:
    ws: WebSocket
    state: MockState
    persona: str = "assistant"
    voice: str = "joe"
    turn_ids: Any = field(default_factory=lambda: itertools.count(1))
    reply: asyncio.Task[None] | None = None
    heard_ms: float = 0.0
    voiced_ms: float = 0.0
    silent_ms: float = 0.0
    speaking: bool = False
    next_turn: int = 0

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(msg))

    async def respond(self, turn_id: int, text: str, heard: str | None) -> None:
        """heard: "voice" or "text" for a reply to the user (its turn.trace says which); None for a greeting,
        which, as on the real server, has no trace."""
        freq = 330.0 if self.voice == "kal" else 220.0  # the voice is audible in the pitch
        for i, word in enumerate(text.split(" ")):  # deltas as an LLM's tokens come: the space before the word
            await self.send({"type": "response.text.delta", "turn_id": turn_id, "text": word if i == 0 else " " + word})
        pcm = sine_pcm(self.state.reply_s, freq)
        chunk = OUT_RATE // 10 * 2  # 100 ms of PCM16
        sent = 0
        try:
            for seq, start in enumerate(range(0, len(pcm), chunk)):
                await self.ws.send_bytes(pack_audio(turn_id, seq, pcm[start : start + chunk]))
                sent += 1
                await asyncio.sleep(0.05)  # twice real time, like a TTS that keeps ahead
                if sent == self.state.stall_after:
                    await asyncio.sleep(self.state.stall_s)  # a TTS that fell behind
            await self.send({"type": "response.done", "turn_id": turn_id, "text": text, "interrupted": False, "spoken_text": text})
            over = [k for k, v in CANNED_STAGES.items() if v > BUDGETS[k]]
            if heard is not None:
                await self.send({"type": "turn.trace", "turn_id": turn_id, "input": heard, "marks_ms": {},
                                 "stages_ms": CANNED_STAGES, "budgets_ms": BUDGETS, "over_budget": over,
                                 **({"turn": CANNED_TURN} if heard == "voice" else {})})  # fmt: skip
        except asyncio.CancelledError:
            with contextlib.suppress(WebSocketDisconnect):  # cancelled because the client left: nobody to tell
                await self.send({"type": "response.audio.clear", "turn_id": turn_id})
                await self.send({"type": "response.done", "turn_id": turn_id, "text": text, "interrupted": True,
                                 "spoken_text": " ".join(text.split()[: max(1, sent // 5)])})  # fmt: skip
            raise

    def start_reply(self, text: str, heard: str | None = None) -> int:
        turn_id = next(self.turn_ids)
        self.reply = asyncio.create_task(self.respond(turn_id, text, heard))
        return turn_id

    async def cancel_reply(self) -> None:
        if self.reply and not self.reply.done():
            self.reply.cancel()
            try:
                await self.reply
            except asyncio.CancelledError:
                pass

    async def on_audio(self, data: bytes) -> None:
        self.state.audio_bytes += len(data)
        pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
        ms = 1000.0 * len(pcm) / IN_RATE
        self.heard_ms += ms
        if len(pcm) and float(np.sqrt(np.mean(pcm**2))) >= self.state.voiced_rms:
            self.voiced_ms, self.silent_ms = self.voiced_ms + ms, 0.0
            if not self.speaking and self.voiced_ms >= 100:
                self.speaking = True
                self.state.speech_starts += 1
                await self.send({"type": "vad.speech_started", "turn_id": self.next_turn, "t_ms": self.heard_ms - self.voiced_ms})
                await self.cancel_reply()
                await self.send({"type": "transcript.partial", "turn_id": self.next_turn, "text": TRANSCRIPT.split()[0]})
            return
        self.silent_ms += ms
        if self.silent_ms >= 60:
            self.voiced_ms = 0.0
        if self.speaking and self.silent_ms >= 400:
            self.speaking = False
            await self.send({"type": "vad.speech_ended", "turn_id": self.next_turn, "t_ms": self.heard_ms - self.silent_ms})
            turn_id = self.start_reply(REPLY_TEXT, "voice")
            self.next_turn = turn_id + 1
            await self.send({"type": "transcript.final", "turn_id": turn_id, "text": TRANSCRIPT})

    async def on_text(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "input.text":
            self.state.texts.append(data["text"])
            await self.cancel_reply()
            self.next_turn = self.start_reply(f"You said: {data['text']}.", "text") + 1
        elif kind == "response.cancel":
            self.state.cancels += 1
            await self.cancel_reply()
        elif kind == "session.update":
            self.state.updates.append(data)
            await self.cancel_reply()
            if data.get("persona"):
                self.persona = data["persona"]
                self.voice = _persona(self.persona)["voice"]
            self.voice = data.get("voice") or self.voice
            await self.send({"type": "session.updated", "persona": self.persona, "voice": self.voice})
            if data.get("persona"):
                self.next_turn = self.start_reply(_persona(self.persona)["greeting"]) + 1
        elif kind == "playback.mark":
            self.state.marks.append((data["turn_id"], data["played_ms"]))
            self.state.mark_bodies.append(data)
        else:
            await self.send({"type": "error", "code": "bad_message", "message": f"unknown type {kind}", "fatal": False})


def _persona(name: str) -> dict[str, Any]:
    return next(p for p in PERSONAS if p["name"] == name)


def sine_pcm(seconds: float, freq: float = 220.0, rate: int = OUT_RATE) -> bytes:
    t = np.arange(int(seconds * rate)) / rate  # [N]
    wave = 0.3 * np.sin(2 * math.pi * freq * t) * np.minimum(1.0, t * 20)  # 50 ms fade-in, no click
    return (wave * 32767).astype("<i2").tobytes()


def create_app(state: MockState) -> FastAPI:
    app = FastAPI()
    active: set[int] = set()

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True, "sessions": len(active)})

    @app.websocket("/ws")
    async def ws_endpoint(ws: WebSocket) -> None:
        given = ws.query_params.get("token") or ws.headers.get("authorization", "").removeprefix("Bearer ")
        if state.token and given != state.token:
            if state.token_refusal == "http":
                await ws.send_denial_response(PlainTextResponse("bad token\n", status_code=401))
                return
            await ws.accept()
            await ws.send_text(json.dumps({"type": "error", "code": "unauthorized", "message": "missing or wrong token", "fatal": True}))
            await ws.close(code=1008)
            return
        await ws.accept()
        if len(active) >= state.max_sessions:
            await ws.send_text(json.dumps({"type": "error", "code": "session_full", "message": "server full", "fatal": True}))
            await ws.close(code=1013)
            return
        s = _Session(ws, state)
        active.add(id(s))
        try:
            start = json.loads(await ws.receive_text())
            assert start["type"] == "session.start" and start["sample_rate"] == IN_RATE, start
            state.starts.append(start)
            state.sessions += 1
            s.persona = start.get("persona") or s.persona
            s.voice = start.get("voice") or _persona(s.persona)["voice"]
            await s.send({"type": "session.ready", "session_id": f"mock-{id(s):x}", "resume_token": None, "resumed": False, "protocol": 1, "input_sample_rate": IN_RATE,
                          "output_sample_rate": OUT_RATE, "persona": s.persona, "voice": s.voice,
                          "personas": PERSONAS, "voices": VOICES})  # fmt: skip
            if state.greeting:
                s.next_turn = s.start_reply(state.greeting) + 1
            else:
                s.next_turn = 1
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("bytes") is not None:
                    await s.on_audio(msg["bytes"])
                else:
                    await s.on_text(json.loads(msg["text"]))
        except WebSocketDisconnect:
            pass
        finally:
            active.discard(id(s))
            if s.reply:
                s.reply.cancel()

    app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")  # as the real server does
    return app


class MockServer:
    """The mock served in this process and event loop (uvicorn); `close()` then `await wait_closed()`."""

    def __init__(self, server: Any, task: asyncio.Task[None]) -> None:
        self._server, self._task = server, task

    @property
    def port(self) -> int:
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    def close(self) -> None:
        self._server.should_exit = True

    async def wait_closed(self) -> None:
        await self._task


async def start_mock(state: MockState, port: int = 0) -> MockServer:
    import uvicorn

    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            ws_max_size=2**24)  # fmt: skip
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # the test runner keeps its signals
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # raises what stopped it (the port in use, say)
        await asyncio.sleep(0.01)
    return MockServer(server, task)


def port_of(server: MockServer) -> int:
    return server.port


def main(argv: list[str]) -> None:
    import uvicorn

    port = int(argv[0])
    state = MockState.options(argv[1] if len(argv) > 1 else "")
    print(f"Parley mock is listening on http://127.0.0.1:{port}  options {asdict(state)}", flush=True)
    uvicorn.run(create_app(state), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
