"""One user utterance being heard: its audio (held back during the hangover), recognition tasks, and the
bookkeeping of work done ahead of the endpoint. Knows nothing of VAD models, the engine or the wire.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.asr import StreamingTranscriber
from voice.llm_bridge import LlmFinish
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
    ahead: asyncio.Task[Any] | None = None  # the final decode started at SpeechPaused
    prefill: asyncio.Task[Any] | None = None  # the engine prefill started beside it
    ahead_start_ns: int | None = None
    final_text: str = ""
    final_ns: int | None = None
    final_event: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_start_ns: int | None = None
    prefill_done_ns: int | None = None
    prefill_result: LlmFinish | None = None
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
        if self.ahead is not None or self.prefill is not None:
            self.discarded_ahead += 1
        self._cancel_ahead()
        self.ahead_start_ns = self.final_ns = self.prefill_start_ns = self.prefill_done_ns = None
        self.prefill_result = None
        self.final_event = asyncio.Event()
        self.final_text = ""

    def _cancel_ahead(self) -> None:
        for task in (self.ahead, self.prefill):
            if task is not None:
                task.cancel()  # the prefill's engine stream is cancelled as its iterator closes
        self.ahead = self.prefill = None

    def discard(self) -> None:
        self._cancel_ahead()
        if self.partial_task is not None:
            self.partial_task.cancel()

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
            await asyncio.gather(waiter, return_exceptions=True)

    def savings(self, endpoint_ns: int, llm_start_ns: int | None = None, reply: LlmFinish | None = None) -> dict[str, Any]:
        """What the work ahead of the endpoint saved the reply (`reply`: the reply request's finish, once known).

        asr_ms: the part of the final decode that ran before the endpoint. prefill_tokens: tokens the ahead
        prefill computed; reused_tokens: how many of those the reply took from the cache (its prompt diverges
        where the final transcript differs from the committed text). prefill_ms: the lesser of two estimates of
        what computing those tokens would have cost the reply: the ahead prefill's engine time before the
        reply's request started, and the reply's own per-token prefill time (the ahead forward shares the
        cores with the final decode, so its wall time overstates the work). 0 until the reply's reuse is known."""
        asr_ms = 0.0
        if self.ahead_start_ns is not None and self.final_ns is not None:
            asr_ms = max(0.0, (min(self.final_ns, endpoint_ns) - self.ahead_start_ns) / 1e6)
        prefill_ms, computed, used = 0.0, 0, 0
        result, done = self.prefill_result, self.prefill_done_ns
        if result is not None and done is not None:
            computed = result.prefill_tokens
            if reply is not None and computed > 0:
                # tokens the reply found cached beyond what the cache held before the ahead prefill
                used = max(0, min(computed, reply.reused_tokens - result.reused_tokens))
                compute_start = done - int(result.prefill_ms * 1e6)  # the engine's forward ends at about `done`
                before = (done if llm_start_ns is None else min(done, llm_start_ns)) - compute_start
                ahead_ms = max(0.0, before / 1e6) * used / computed
                reply_ms = reply.prefill_ms / max(1, reply.prefill_tokens) * used
                prefill_ms = min(ahead_ms, reply_ms)
        return {
            "asr_ms": round(asr_ms, 3),
            "prefill_ms": round(prefill_ms, 3),
            "saved_ms": round(asr_ms + prefill_ms, 3),
            "prefill_tokens": computed,
            "reused_tokens": used,
            "discarded": self.discarded_ahead,
        }
