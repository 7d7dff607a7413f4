"""A session's outgoing messages, drained by the socket writer.

Audio is bounded (a slow client back-pressures the TTS, memory never grows without bound); control messages
never wait behind audio, and `clear(turn_id)` drops that turn's queued audio at once. Knows nothing of the wire
format beyond "a dict with a type" and "PCM16 bytes of a turn".
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutJson:
    body: dict[str, Any]  # includes "type"


@dataclass(frozen=True)
class OutAudio:
    turn_id: int
    seq: int
    pcm16: bytes
    on_sent: Callable[[], None] | None = None  # called by the writer right after the socket write


Outgoing = OutJson | OutAudio


class Outbox:
    """`max_json_items`: control messages waiting for a client that does not read. Past it they are dropped and
    `overflowed` is set, for the socket layer to end the connection (a client this far behind is not listening)."""

    def __init__(self, max_audio_items: int = 64, max_json_items: int = 256) -> None:
        self._items: deque[Outgoing] = deque()
        self._json = 0  # OutJson items queued
        self.max_json_items = max_json_items
        self.overflowed = False
        self._ready = asyncio.Event()
        self._audio_room = asyncio.Semaphore(max_audio_items)
        # turns whose audio was cleared; replies run one after another, so the last few are all a late chunk can be of
        self._cleared: deque[int] = deque(maxlen=8)
        self._seq_turn: int | None = None  # the turn whose audio is being sent, and its next sequence number
        self._seq = 0

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a JSON message; never blocks (control messages are small and few)."""
        if self._json >= self.max_json_items:
            self.overflowed = True
            return
        self._json += 1
        self._items.append(OutJson({"type": kind, **fields}))
        self._ready.set()

    async def send_audio(self, turn_id: int, pcm16: bytes, on_sent: Callable[[], None] | None = None) -> None:
        """Queue one audio chunk of a turn; waits while the client is behind."""
        if turn_id in self._cleared:
            return
        await self._audio_room.acquire()
        if turn_id in self._cleared:  # cleared while we waited for room
            self._audio_room.release()
            return
        if turn_id != self._seq_turn:
            self._seq_turn, self._seq = turn_id, 0
        self._items.append(OutAudio(turn_id, self._seq, pcm16, on_sent))
        self._seq += 1
        self._ready.set()

    def clear(self, turn_id: int, **fields: Any) -> None:
        """Drop the turn's queued audio, ignore its later audio, and send `response.audio.clear` first in line."""
        if turn_id not in self._cleared:
            self._cleared.append(turn_id)
        kept: deque[Outgoing] = deque()
        for item in self._items:
            if isinstance(item, OutAudio) and item.turn_id == turn_id:
                self._audio_room.release()
            else:
                kept.append(item)
        kept.appendleft(OutJson({"type": "response.audio.clear", "turn_id": turn_id, **fields}))
        self._json += 1
        self._items = kept
        self._ready.set()

    async def get(self) -> Outgoing:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, OutAudio):
            self._audio_room.release()
        else:
            self._json -= 1
        return item

    def pending(self) -> int:
        return len(self._items)
