"""One user utterance being heard: its audio (held back during the hangover), recognition tasks, and the
bookkeeping of work done ahead of the endpoint. Knows nothing of VAD models, the engine or the wire.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.asr import StreamingTranscriber
from voice.trace import TurnTrace


@dataclass
class Utterance:
    turn_id: int
    trace: TurnTrace
    start_ms: float  # audio time of the first voiced sample
    stt: StreamingTranscriber
    during_reply: bool  # began while the assistant was speaking: a turn only if it barges in
    barged: bool = False
    paused: bool = False
    held: list[np.ndarray] = field(default_factory=list)  # hangover audio: part of the turn only if speech resumes
    partial_task: asyncio.Task[Any] | None = None
    ahead: asyncio.Task[Any] | None = None
    ahead_start_ns: int | None = None
    final_text: str = ""
    final_ns: int | None = None
    final_event: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_start_ns: int | None = None
    prefill_done_ns: int | None = None
    prefill_history_len: int | None = None
    discarded_ahead: int = 0

    def feed(self, samples: np.ndarray) -> None:
        if self.paused:
            self.held.append(samples)
        else:
            self.stt.append(samples)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Speech came back: the pause was inside the turn, and anything computed on it is stale."""
        self.paused = False
        for samples in self.held:
            self.stt.append(samples)
        self.held.clear()
        if self.ahead is not None:
            self.ahead.cancel()
            self.ahead = None
            self.discarded_ahead += 1
        self.ahead_start_ns = self.final_ns = self.prefill_start_ns = self.prefill_done_ns = None
        self.final_event = asyncio.Event()
        self.prefill_history_len = None
        self.final_text = ""

    def discard(self) -> None:
        for task in (self.ahead, self.partial_task):
            if task is not None:
                task.cancel()

    async def final_ready(self) -> None:
        """Wait until the ahead task has its transcript (or has ended without one)."""
        ahead = self.ahead
        if ahead is None or self.final_event.is_set():
            return
        waiter = asyncio.ensure_future(self.final_event.wait())
        try:
            await asyncio.wait([ahead, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def savings(self, endpoint_ns: int, history_len: int) -> dict[str, Any]:
        """How much recognition and prefill ran before the endpoint, i.e. was not paid after it."""
        asr_ms = 0.0
        if self.ahead_start_ns is not None and self.final_ns is not None:
            asr_ms = max(0.0, (min(self.final_ns, endpoint_ns) - self.ahead_start_ns) / 1e6)
        prefill_ms = 0.0
        done, start = self.prefill_done_ns, self.prefill_start_ns
        if done is not None and start is not None and self.prefill_history_len == history_len:
            prefill_ms = max(0.0, (min(done, endpoint_ns) - start) / 1e6)
        return {
            "asr_ms": round(asr_ms, 3),
            "prefill_ms": round(prefill_ms, 3),
            "saved_ms": round(asr_ms + prefill_ms, 3),
            "discarded": self.discarded_ahead,
        }
