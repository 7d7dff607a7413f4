"""A WebRTC test client on aiortc (no browser): a microphone track that plays queued speech at real time (silence
otherwise), the server's reply track recorded as it arrives, and /ws's JSON messages on the `parley` data channel.
Host candidates only, like the server."""
from __future__ import annotations

import asyncio
import fractions
import json
import time
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from support.messages import MessageLog
from voice.audio import resample

RATE = 48000
FRAME = 960  # 20 ms


class Microphone(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.queue = np.zeros(0, dtype=np.float32)  # what is still to be said, at 48 kHz
        self.sent_s = 0.0
        self._start: float | None = None
        self._pts = 0

    def say(self, audio16: np.ndarray) -> float:
        """Queue 16 kHz speech; -> seconds until it has all been sent."""
        self.queue = np.concatenate([self.queue, resample(audio16, 16000, RATE)])
        return len(self.queue) / RATE

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk = np.zeros(FRAME, dtype=np.float32)
        n = min(FRAME, len(self.queue))
        chunk[:n], self.queue = self.queue[:n], self.queue[n:]
        self.sent_s += FRAME / RATE
        frame = av.AudioFrame.from_ndarray((np.clip(chunk, -1, 1) * 32767).astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, fractions.Fraction(1, RATE)
        return frame


@dataclass
class RtcClient(MessageLog):
    wait_timeout_s = 60.0
    http: str = ""
    token: str | None = None
    origin: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    heard: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (arrival, 48 kHz mono) per frame
    answer: dict[str, Any] = field(default_factory=dict)

    async def __aenter__(self) -> "RtcClient":
        self._changed = asyncio.Event()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("parley")
        self.channel.on("message", self._message)
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", lambda track: self._tasks.append(asyncio.create_task(self._record(track))))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.origin:
            headers["Origin"] = self.origin
        async with httpx.AsyncClient(base_url=self.http, timeout=30) as http:
            r = await http.post("/webrtc/offer", json={"type": "offer", "sdp": self.pc.localDescription.sdp}, headers=headers)
        self.answer = {"status": r.status_code, **r.json()}
        if r.status_code == 200:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=self.answer["sdp"], type="answer"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()

    def _message(self, raw: str | bytes) -> None:
        if isinstance(raw, str):
            self.messages.append({**json.loads(raw), "at_s": time.monotonic()})
            self._changed.set()

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).astype(np.float32).mean(axis=1) / 32768.0
            self.heard.append((time.monotonic(), pcm))
            self._changed.set()

    async def start(self) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while self.channel.readyState != "open":
            assert time.monotonic() < deadline, f"the data channel did not open ({self.pc.connectionState})"
            await asyncio.sleep(0.02)
        await self.send(type="session.start", protocol=1)
        return await self.wait_for("session.ready")

    async def send(self, **msg: Any) -> None:
        self.channel.send(json.dumps(msg))

    def audio_since(self, t_s: float) -> np.ndarray:
        """What the reply track brought after `t_s`, resampled to 16 kHz."""
        parts = [pcm for at, pcm in self.heard if at >= t_s]
        return resample(np.concatenate(parts), RATE, 16000) if parts else np.zeros(0, np.float32)

    async def sound_after(self, after_s: float, timeout_s: float = 60) -> None:
        """Wait until the reply track brings audible sound after `after_s`."""
        async with asyncio.timeout(timeout_s):
            while not any(at >= after_s and np.sqrt(np.mean(pcm**2)) > 0.01 for at, pcm in self.heard):
                self._changed.clear()
                await self._changed.wait()

    async def quiet_for(self, seconds: float, after_s: float, timeout_s: float = 60) -> None:
        """Wait until the reply track has brought `seconds` of silence in a row after `after_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = 0.0
            for at, pcm in self.heard:
                if at < after_s:
                    continue
                run = run + len(pcm) / RATE if np.sqrt(np.mean(pcm**2)) < 0.003 else 0.0
            if run >= seconds:
                return
            assert time.monotonic() < deadline, "the reply track never went quiet"
            await asyncio.sleep(0.05)
