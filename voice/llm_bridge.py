"""The one door from voice/ into llm_engine: engine events become an async iterator on the event loop.

Events cross from the engine thread with loop.call_soon_threadsafe; closing the call before its end cancels the
engine stream. It knows nothing of audio, sessions or the wire.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from llm_engine.constrain import Constraint
from llm_engine.engine import ChatMessage, ErrorEvent, FinishEvent, GenerateRequest, SamplingParams, TokenEvent
from llm_engine.tool_format import ToolSpec
from voice.turn_policy import TEXT_EVEN_ODDS


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
    generated_tokens: int = 0  # the reply's tokens
    shared_prefix_tokens: int = 0  # prompt tokens copied from another session's cache (the engine's prefix cache)
    dropped_messages: int = 0  # the oldest messages the engine left out so the prompt fit its context


@dataclass(frozen=True)
class LlmError:
    message: str


LlmEvent = LlmToken | LlmFinish | LlmError


@dataclass(frozen=True)
class ToolAsk:
    """The tools a request may call, for an LLM that takes them natively (voice.remote.llm passes them to its server).
    Our engine takes the grammar instead (`constraint`) and has the tools in the prompt's text: it ignores this."""

    tools: tuple[ToolSpec, ...] = ()
    choice: str = "auto"  # none | auto | required | a tool's name
    parallel: bool = True  # parallel_tool_calls
    response_format: dict[str, Any] | None = None  # OpenAI's response_format (json_object / json_schema), as is


def _translate(ev: Any) -> LlmEvent:
    if isinstance(ev, TokenEvent):
        return LlmToken(ev.text)
    if isinstance(ev, FinishEvent):
        t = ev.timings
        return LlmFinish(
            ev.reason, float(t.prefill_ms), int(t.prefill_tokens), int(t.reused_tokens), int(t.decode_tokens),
            float(t.queue_ms), ev.end_prob, int(ev.generated), int(t.shared_prefix_tokens),
            int(getattr(ev, "dropped_messages", 0)),
        )  # fmt: skip
    if isinstance(ev, ErrorEvent):
        return LlmError(ev.message)
    raise TypeError(f"unexpected engine event {type(ev).__name__}")


class LlmCall:
    """One request's events as an async iterator: LlmToken... then one LlmFinish or LlmError. Closing it before the
    end (`aclose()`, or `async with aclosing(...)` left early) cancels the request; `hold()` pauses its steps."""

    def __init__(self, engine: Any, request: GenerateRequest) -> None:
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

        def on_event(ev: Any) -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(self._queue.put_nowait, ev)
            except RuntimeError:  # loop already closed: the session is gone, nobody to tell
                pass

        self._stream = engine.submit(request, on_event=on_event)
        self._finished = False

    def __aiter__(self) -> "LlmCall":
        return self

    async def __anext__(self) -> LlmEvent:
        if self._finished:
            raise StopAsyncIteration
        event = _translate(await self._queue.get())
        self._finished = isinstance(event, LlmFinish | LlmError)
        return event

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._stream.cancel()  # takes effect within one decode step on the engine thread

    def hold(self, on: bool) -> None:
        """Pause (True) or resume (False) the request's decoding: it keeps its place and its cache."""
        if not self._finished:
            self._stream.hold(on)


class LlmBridge:
    """Wraps one started Engine (or anything with its submit/release/active_slots shape)."""

    probes_user_end = True  # prefill(probe_user_end=True) reads the end-of-turn probability (voice.remote.llm: no)
    native_tools = False  # tools go in the prompt's text and calls are bound by a grammar (voice.remote.llm: True)
    local_cache = True  # prefill() fills a cache here, for the cost of the new tokens alone (voice.remote.llm: no)

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def text_even_odds(self) -> float:
        """The end-of-turn probe's even-odds point for this model (llm_engine.families; voice.turn_policy reads it)."""
        family = getattr(self.engine, "family", None)
        return family.text_even_odds if family is not None else TEXT_EVEN_ODDS

    def generate(
        self,
        session_id: str,
        messages: Sequence[tuple[str, str] | ChatMessage],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        probe_user_end: bool = False,
        constraint: Constraint | None = None,
        tools: ToolAsk | None = None,
        background: bool = False,
    ) -> LlmCall:
        """Submit a request; iterate the call for its events (in the event loop's thread). `messages`: (role, content)
        pairs, or ChatMessages (a tool call and its result). `constraint`: decode under that grammar. `tools`: unused
        here (the grammar binds the calls, and the tools are in the prompt's text: voice.tool_turn.with_tools).
        `background`: nobody waits for it (the engine runs its prompt after the others', in small chunks)."""
        request = GenerateRequest(
            session_id=session_id,
            messages=tuple(m if isinstance(m, ChatMessage) else ChatMessage(*m) for m in messages),
            sampling=SamplingParams(temperature=temperature, seed=seed, max_new_tokens=max_new_tokens),
            probe_user_end=probe_user_end,
            constraint=constraint,
            background=background,
        )
        return LlmCall(self.engine, request)

    async def prefill(
        self, session_id: str, messages: Sequence[tuple[str, str]], *, probe_user_end: bool = False
    ) -> LlmFinish | LlmError:
        """Prefill only (max_new_tokens=0): warms this session's KV slot for a request with the same prefix.
        probe_user_end: the finish also carries how likely the last (user) message is complete."""
        last: LlmFinish | LlmError = LlmError("no finish event")
        async with aclosing(self.generate(session_id, messages, max_new_tokens=0, probe_user_end=probe_user_end)) as call:
            async for event in call:
                if isinstance(event, LlmFinish | LlmError):
                    last = event
        return last

    def system_with_tools(self, system: str, tools: Sequence[ToolSpec]) -> str | None:
        """The system prompt with the tools worded by the model's own chat template, where its family calls them
        best so (llm_engine.families); None: our prompt format."""
        tokenizer = getattr(self.engine, "tokenizer", None)  # (an engine double in the orchestration tests has none)
        family = getattr(self.engine, "family", None)
        if tokenizer is None or (family is not None and family.tools_wording != "template"):
            return None
        return tokenizer.system_with_tools(system, tools)

    async def warm_grammar(self) -> None:
        """The engine tokenizer's grammar view, built once (~1 s) off the event loop."""
        tokenizer = getattr(self.engine, "tokenizer", None)  # (an engine double in the orchestration tests has none)
        if tokenizer is not None:
            from llm_engine import constrain

            await asyncio.to_thread(constrain.warm, tokenizer)

    def release(self, session_id: str) -> None:
        self.engine.release(session_id)

    def active_slots(self) -> int:
        return int(self.engine.active_slots())

    def other_requests(self, session_id: str) -> int:
        """Requests of other sessions in the engine now (queued, running or held): is it busy for anyone else?"""
        count = getattr(self.engine, "requests_besides", None)
        return 0 if count is None else int(count(session_id))

    def prefix_cache_counts(self) -> tuple[int, int]:
        """(requests that copied a prompt prefix from another session's slot, tokens those copies saved)."""
        return int(getattr(self.engine, "prefix_hits", 0)), int(getattr(self.engine, "prefix_tokens", 0))

    def busy_seconds(self) -> tuple[float, dict[str, float]]:
        """(seconds of engine steps, each session's share of them), as the engine thread last wrote them."""
        return float(getattr(self.engine, "busy_total_s", 0.0)), dict(getattr(self.engine, "busy_s", {}))

    @property
    def decode_path(self) -> str | None:
        """Which path the engine's decode steps take, and why (llm_engine.batch.StepDecoder)."""
        return getattr(self.engine, "decode_path", None)
