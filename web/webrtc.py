"""WebRTC: `POST /webrtc/offer` answers a browser's (or any WebRTC client's) SDP offer with aiortc, and the call is
one /ws Connection (web.ws) over a data channel instead of a socket: the same JSON messages both ways, the same
session, limits and errors. The microphone comes as an Opus track (read into 16 kHz, web.webrtc_media) and the
reply goes out as one, paced at 20 ms; a barge-in's `response.audio.clear` empties the server's queue, and the
server reports what it played as playback marks itself. ICE: host candidates only, unless `webrtc.ice_servers`
names STUN/TURN servers (aiortc's built-in public STUN server is never used). docs/protocol.md, WebRTC.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Literal

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.websockets import WebSocketState

import numpy as np

from parley.config import AppConfig
from voice.audio import pcm16_to_float
from voice.session import InputError
from voice.trace import now_ns
from web import protocol as P
from web.limits import given_token, origin_allowed
from web.state import AppState
from web.webrtc_loss import skip_lost_packets
from web.webrtc_media import ReplyTrack, read_microphone
from web.ws import Connection

log = logging.getLogger(__name__)
MAX_OFFER_BYTES = 64 * 1024
CONNECT_GRACE_S = 10.0  # ICE, DTLS and the data channel's opening, on top of the session.start deadline
CHANNEL_LABEL = "parley"


class Offer(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["offer"]
    sdp: str = Field(min_length=10, max_length=MAX_OFFER_BYTES)


def ice_servers(cfg: AppConfig, *, secrets: bool = True) -> list[dict[str, Any]]:
    """The configured STUN/TURN servers, as RTCIceServer fields (the credential read from its variable)."""
    out = []
    for server in cfg.webrtc.ice_servers:
        entry: dict[str, Any] = {"urls": list(server.urls)}
        if server.username is not None:
            entry["username"] = server.username
        if server.credential_env is not None and secrets:
            entry["credential"] = os.environ.get(server.credential_env, "")
        out.append(entry)
    return out


class ChannelSocket:
    """What web.ws.Connection uses of a WebSocket, over a data channel (JSON, and /ws's binary audio if a client
    sends it) and the reply track (the binary audio the writer sends goes into it)."""

    def __init__(self, pc: RTCPeerConnection, track: ReplyTrack) -> None:
        self.pc, self.track = pc, track
        self.channel: RTCDataChannel | None = None
        self.application_state = WebSocketState.CONNECTED
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def attach(self, channel: RTCDataChannel) -> None:
        if self.channel is not None or channel.label != CHANNEL_LABEL:
            return  # one conversation a call
        self.channel = channel
        channel.on("message", self._message)
        channel.on("close", self.disconnect)

    def _message(self, message: str | bytes) -> None:
        key = "text" if isinstance(message, str) else "bytes"
        self._inbox.put_nowait({"type": "websocket.receive", key: message})

    def disconnect(self) -> None:
        if self.application_state == WebSocketState.CONNECTED:
            self.application_state = WebSocketState.DISCONNECTED
            # a data channel cannot say why it closed: held for a reconnect (web.resume), as a dropped socket is
            self._inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})

    async def receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def send_text(self, text: str) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            raise RuntimeError("the data channel is not open")
        if '"response.audio.clear"' in text:  # the barge-in: what the track still holds of that reply goes
            self.track.clear(int(json.loads(text)["turn_id"]))
        channel.send(text)

    async def send_bytes(self, data: bytes) -> None:
        turn_id, _, pcm = P.unpack_audio(data)
        self.track.push(turn_id, pcm16_to_float(pcm))

    async def close(self, code: int = 1000) -> None:
        self.disconnect()
        await self.pc.close()


class WebRtcConnection(Connection):
    """A /ws connection whose socket is a ChannelSocket, plus the microphone track and the played-audio marks."""

    transport = "webrtc"

    def __init__(self, socket: ChannelSocket, state: AppState, auth: str) -> None:
        super().__init__(socket, state, auth)  # type: ignore[arg-type]  # duck-typed: what Connection uses of a socket
        self._opened_at = time.monotonic() + CONNECT_GRACE_S
        self._media: set[asyncio.Task[None]] = set()

    def listen(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        task = asyncio.create_task(read_microphone(track, self.heard), name=f"parley:{self.session_id}:microphone")
        self._media.add(task)
        task.add_done_callback(self._media.discard)

    def heard(self, samples: np.ndarray, rate: int) -> None:
        """The microphone's next samples (at the track's `rate`): to the session once it started."""
        if self.session is None or samples.size == 0:
            return
        self._active_at = time.monotonic()
        try:
            self.session.push_audio(samples, now_ns(), rate)
        except InputError as exc:
            self._limited(exc.code, exc.message)

    def played(self, turn_id: int, played_ms: float) -> None:
        """The reply track played this much of a turn: the session's playback mark (the server knows, the client
        cannot tell one reply from the next in a media track)."""
        if self.session is None:
            return
        try:
            self.session.playback_mark(turn_id, played_ms, now_ns())
        except InputError as exc:  # a mark the session cannot use (its turn long gone): nothing to tell the client
            log.debug("webrtc %s: playback mark: %s", self.session_id, exc.message)

    def stop_media(self) -> None:
        for task in self._media:
            task.cancel()


def _refuse(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "code": code, "message": message, "fatal": True}, status_code=status)


async def offer(request: Request, state: AppState, calls: set[asyncio.Task[None]]) -> JSONResponse:
    server = state.cfg.server
    if not origin_allowed(request.headers.get("origin"), request.headers.get("host"), server.allowed_origins):
        return _refuse(403, "forbidden_origin", f"origin {P.clip(request.headers.get('origin'))} is not allowed")
    if (full := state.refusal()) is not None:
        return _refuse(503, "server_full", f"{full}; try again later")
    body = await request.body()
    if len(body) > MAX_OFFER_BYTES:
        return _refuse(413, "too_large", f"an offer of {len(body)} bytes; the limit is {MAX_OFFER_BYTES}")
    try:
        sdp = Offer.model_validate_json(body)
    except ValidationError as exc:
        return _refuse(400, "invalid_offer", f"not an SDP offer ({{type: offer, sdp}}): {exc.errors()[0]['msg']}")
    servers = [RTCIceServer(**entry) for entry in ice_servers(state.cfg)]
    pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))  # [] when none: no public STUN server
    auth = given_token(request.query_params, request.headers, request.cookies) or ""
    conn = WebRtcConnection(ChannelSocket(pc, ReplyTrack(state.settings.output_sample_rate)), state, auth)
    socket: ChannelSocket = conn.ws  # type: ignore[assignment]
    socket.track.on_played = conn.played
    pc.on("datachannel", socket.attach)
    pc.on("track", conn.listen)

    @pc.on("connectionstatechange")
    def _state() -> None:
        if pc.connectionState in ("failed", "closed"):
            socket.disconnect()

    pc.addTrack(socket.track)
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp.sdp, type="offer"))
        skip_lost_packets(pc)  # the microphone's receiver: a lost packet is given up after 80 ms, not 300
        await pc.setLocalDescription(await pc.createAnswer())
    except (ValueError, TypeError, KeyError, IndexError) as exc:  # what aiortc raises for SDP it cannot use
        await pc.close()
        return _refuse(400, "invalid_offer", f"the offer cannot be answered: {P.shorten(str(exc), 200)}")
    if len(state.pending) >= server.max_pending:
        next(iter(state.pending)).evict()
    state.pending[conn] = None
    state.live.add(conn)
    state.connections += 1
    task = asyncio.create_task(_run(conn), name=f"parley:{conn.session_id}:webrtc")
    calls.add(task)
    task.add_done_callback(calls.discard)
    return JSONResponse({"type": "answer", "sdp": pc.localDescription.sdp, "session_id": conn.session_id})


async def _run(conn: WebRtcConnection) -> None:
    state = conn.state
    try:
        await conn.run()
    finally:
        conn.stop_media()
        state.pending.pop(conn, None)
        state.live.discard(conn)
        state.connections -= 1
        await conn.ws.close()  # type: ignore[call-arg]
