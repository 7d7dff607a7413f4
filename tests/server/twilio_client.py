"""A scripted Twilio Media Streams client: it says `connected` and `start`, streams the caller's μ-law audio in
20 ms `media` messages at real time, and plays what the server sends as Twilio would: `media` into a playback
queue at 8 kHz, each `mark` echoed once the audio before it has played, `clear` empties the queue and echoes the
marks still pending at once."""
from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from voice import codec

CHUNK = 160  # 20 ms of μ-law


@dataclass
class TwilioClient:
    url: str
    params: dict[str, str] = field(default_factory=dict)
    stream_sid: str = "MZ00000000000000000000000000000001"
    received: list[dict[str, Any]] = field(default_factory=list)  # every server message, with `at_s`
    echoed: list[str] = field(default_factory=list)  # mark names echoed back
    played_until_s: float = 0.0  # when what is queued has played
    pending_marks: list[tuple[float, str]] = field(default_factory=list)  # (due, name)
    sent_media: int = 0
    played: list[tuple[float, bytes]] = field(default_factory=list)  # (when it starts playing, μ-law) as the caller hears it

    async def __aenter__(self) -> "TwilioClient":
        self.ws: ClientConnection = await connect(self.url, max_size=None, open_timeout=10)
        self._reader = asyncio.create_task(self._read())
        self._marker = asyncio.create_task(self._echo_marks())
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self.send({"event": "start", "sequenceNumber": "1", "streamSid": self.stream_sid, "start": {
            "accountSid": "AC0", "streamSid": self.stream_sid, "callSid": "CA0", "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": self.params}})  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.send({"event": "stop", "streamSid": self.stream_sid, "stop": {"accountSid": "AC0", "callSid": "CA0"}})
        except ConnectionClosed:
            pass
        await self.ws.close()
        for task in (self._reader, self._marker):
            task.cancel()
        await asyncio.gather(self._reader, self._marker, return_exceptions=True)

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = {**json.loads(raw), "at_s": time.monotonic()}
                self.received.append(msg)
                now = time.monotonic()
                if msg["event"] == "media":
                    data = base64.b64decode(msg["media"]["payload"])
                    start = max(self.played_until_s, now)
                    self.played.append((start, data))
                    self.played_until_s = start + len(data) / codec.G711_RATE
                elif msg["event"] == "mark":
                    self.pending_marks.append((max(self.played_until_s, now), msg["mark"]["name"]))
                elif msg["event"] == "clear":
                    self.played_until_s = now
                    self.played = [(t, data[: max(0, int((now - t) * codec.G711_RATE))]) for t, data in self.played if t < now]
                    self.pending_marks = [(now, name) for _, name in self.pending_marks]
        except ConnectionClosed:
            pass

    async def _echo_marks(self) -> None:
        while True:
            now = time.monotonic()
            while self.pending_marks and self.pending_marks[0][0] <= now:
                _, name = self.pending_marks.pop(0)
                self.echoed.append(name)
                await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})
            await asyncio.sleep(0.01)

    async def stream(self, ulaw: bytes, until: Any = None) -> None:
        """Send `ulaw` in 20 ms media messages at real time (stopping early once `until()` holds)."""
        t0 = time.monotonic()
        for i in range(0, len(ulaw), CHUNK):
            self.sent_media += 1
            await self.send({"event": "media", "sequenceNumber": str(self.sent_media + 1), "streamSid": self.stream_sid,
                             "media": {"track": "inbound", "chunk": str(self.sent_media), "timestamp": str(self.sent_media * 20),
                                       "payload": base64.b64encode(ulaw[i : i + CHUNK]).decode()}})  # fmt: skip
            if until is not None and until():
                return
            ahead = (i + CHUNK) / codec.G711_RATE - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["event"] == event]

    def heard(self, since_s: float = 0.0) -> np.ndarray:
        """What the caller heard of the audio that began playing at `since_s` or later (a `clear` cut what had not
        played), float32 at 8 kHz, gaps in playback left out."""
        return codec.decode("pcmu", b"".join(data for t, data in self.played if t >= since_s))

    def audio(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The μ-law media received in messages [start:stop], decoded to float32 at 8 kHz."""
        data = b"".join(base64.b64decode(m["media"]["payload"]) for m in self.received[start:stop] if m["event"] == "media")
        return codec.decode("pcmu", data)
