"""The one door from voice/ into llm_engine: engine events become an async iterator on the event loop.

Events cross from the engine thread with loop.call_soon_threadsafe; closing or cancelling the iterator cancels
the engine stream. It knows nothing of audio, sessions or the wire.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from llm_engine.engine import ChatMessage, ErrorEvent, FinishEvent, GenerateRequest, SamplingParams, TokenEvent


@dataclass(frozen=True)
class LlmToken:
    text: str  # clean incremental delta, may be ""


@dataclass(frozen=True)
class LlmFinish:
    reason: str  # stop | length | cancelled | context
    prefill_ms: float
    prefill_tokens: int
    reused_tokens: int
    decode_tokens: int
    queue_ms: float = 0.0  # submit -> prefill start: e.g. waiting behind this session's ahead prefill
    end_prob: float | None = None  # asked with probe_user_end: P(the user's message is complete as it stands)


@dataclass(frozen=True)
class LlmError:
    message: str


LlmEvent = LlmToken | LlmFinish | LlmError


def _translate(ev: Any) -> LlmEvent:
    if isinstance(ev, TokenEvent):
        return LlmToken(ev.text)
    if isinstance(ev, FinishEvent):
        t = ev.timings
        return LlmFinish(
            ev.reason, float(t.prefill_ms), int(t.prefill_tokens), int(t.reused_tokens), int(t.decode_tokens),
            float(t.queue_ms), ev.end_prob,
        )  # fmt: skip
    if isinstance(ev, ErrorEvent):
        return LlmError(ev.message)
    raise TypeError(f"unexpected engine event {type(ev).__name__}")


class LlmBridge:
    """Wraps one started Engine (or anything with its submit/release/active_slots shape)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(
        self,
        session_id: str,
        messages: Sequence[tuple[str, str]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        probe_user_end: bool = False,
    ) -> AsyncIterator[LlmEvent]:
        """Yield LlmToken... then one LlmFinish or LlmError. Leaving early (break, cancel) cancels the stream."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def on_event(ev: Any) -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, ev)
            except RuntimeError:  # loop already closed: the session is gone, nobody to tell
                pass

        request = GenerateRequest(
            session_id=session_id,
            messages=tuple(ChatMessage(role, content) for role, content in messages),
            sampling=SamplingParams(temperature=temperature, seed=seed, max_new_tokens=max_new_tokens),
            probe_user_end=probe_user_end,
        )
        stream = self.engine.submit(request, on_event=on_event)
        finished = False
        try:
            while True:
                event = _translate(await queue.get())
                if isinstance(event, LlmFinish | LlmError):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                stream.cancel()  # takes effect within one decode step on the engine thread

    async def prefill(
        self, session_id: str, messages: Sequence[tuple[str, str]], *, probe_user_end: bool = False
    ) -> LlmFinish | LlmError:
        """Prefill only (max_new_tokens=0): warms this session's KV slot for a request with the same prefix.
        probe_user_end: the finish also carries how likely the last (user) message is complete."""
        last: LlmFinish | LlmError = LlmError("no finish event")
        async for event in self.generate(session_id, messages, max_new_tokens=0, probe_user_end=probe_user_end):
            if isinstance(event, LlmFinish | LlmError):
                last = event
        return last

    def release(self, session_id: str) -> None:
        self.engine.release(session_id)

    def active_slots(self) -> int:
        return int(self.engine.active_slots())
