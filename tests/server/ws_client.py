"""A test client for /ws: collects every server message with its arrival time and the client's audio clock."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from support.messages import MessageLog
from web.protocol import unpack_audio

FRAME_MS = 20
RATE = 16000


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


@dataclass
class Client(MessageLog):
    wait_timeout_s = 60.0  # a real server's replies (its models load once per module)
    url: str
    origin: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    audio_sent_ms: float = 0.0  # the client's audio clock: how much it has streamed
    close_code: int | None = None

    async def __aenter__(self) -> "Client":
        self.ws: ClientConnection = await connect(
            self.url, origin=self.origin, additional_headers=self.headers, max_size=None, open_timeout=10  # type: ignore[arg-type]
        )
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                got = {"at_s": time.monotonic(), "audio_sent_ms": self.audio_sent_ms}
                if isinstance(raw, bytes):
                    turn_id, seq, pcm = unpack_audio(raw)
                    self.messages.append({"type": "audio", "turn_id": turn_id, "seq": seq, "pcm": pcm, **got})
                else:
                    self.messages.append({**json.loads(raw), **got})
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self._changed.set()

    def ended(self) -> str | None:
        return f"connection closed ({self.close_code})" if self._reader.done() else None

    async def wait_closed(self, timeout_s: float = 10.0) -> int | None:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait([self._reader])
        return self.close_code

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def start(self, **fields: Any) -> dict[str, Any]:
        await self.send(type="session.start", protocol=1, **{"sample_rate": RATE, **fields})
        return await self.wait_for("session.ready")

    async def stream(self, audio: np.ndarray, *, realtime: bool = True, until: Any = None, rate: int = RATE) -> None:
        """Send float32 audio at `rate` (the session.start's) in 20 ms frames, paced by the wall clock like a
        microphone."""
        n = rate * FRAME_MS // 1000
        t0 = time.monotonic()
        start_ms = self.audio_sent_ms
        for i in range(0, len(audio), n):
            await self.ws.send(pcm16(audio[i : i + n]))
            self.audio_sent_ms += 1000.0 * len(audio[i : i + n]) / rate
            if until is not None and until():
                return
            if realtime:
                ahead_s = (self.audio_sent_ms - start_ms) / 1000.0 - (time.monotonic() - t0)
                if ahead_s > 0:
                    await asyncio.sleep(ahead_s)

    def turn_audio(self, turn_id: int) -> bytes:
        return b"".join(m["pcm"] for m in self.of("audio", turn_id))


async def open_session(url: str, **fields: Any) -> Client:
    """A connected client whose session has started (`fields` go with session.start); close it with __aexit__."""
    c = Client(url)
    await c.__aenter__()
    await c.start(**fields)
    return c
