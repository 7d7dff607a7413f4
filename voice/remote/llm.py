"""The LLM stage over any OpenAI-compatible chat completions server, in LlmBridge's shape.

Streams through the official `openai` SDK; the session id goes as `user`, which `parley stages` (and routers
that pin by it) use to keep the conversation's cache. Closing a call closes the HTTP stream, which a server
takes as a cancel. The ahead-of-endpoint prefill is a 1-token request with the prompt so far: servers with a
prefix cache (vLLM's automatic prefix caching, `parley stages`) then only prefill the new words at the turn
end. A chat API exposes no prompt probabilities, so there is no text end-of-turn signal (`probes_user_end` is
False): a session's turn-taking then decides from silence and audio (voice.turn_policy.TurnPolicy.without_text).

Tools go to the server natively (`tools`, `tool_choice`, `parallel_tool_calls`, `response_format`: vLLM and OpenAI run
them) and its streamed `tool_calls` come back as the call text our engine writes (voice.remote.tool_wire), after the
reply's content; a call that cannot be run (an unknown tool, arguments that are not a JSON object) is an LlmError.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from llm_engine.tool_format import ToolSpec
from voice.llm_bridge import LlmError, LlmEvent, LlmFinish, LlmToken, ToolAsk
from voice.remote.client import RemoteSpec, trace_headers
from voice.remote.tool_wire import BadToolCall, CallAssembler, tool_fields, wire_messages
from voice.turn_policy import TEXT_EVEN_ODDS

_REASONS = {"stop": "stop", "length": "length", "content_filter": "stop", "tool_calls": "stop"}


class RemoteCall:
    """One request's events: LlmToken... then one LlmFinish or LlmError; `aclose()` closes the stream."""

    def __init__(self, events: AsyncIterator[LlmEvent]) -> None:
        self._events = events

    def __aiter__(self) -> "RemoteCall":
        return self

    async def __anext__(self) -> LlmEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()  # type: ignore[attr-defined]

    def hold(self, on: bool) -> None:
        """Nothing to pause on a remote server: the reply's tokens wait in the socket."""


class RemoteLlm:
    probes_user_end = False  # see the module doc
    native_tools = True  # tools go to the server as `tools` (not in the prompt's text); no grammar here
    local_cache = False  # a prefill is a whole request to the server

    def __init__(self, spec: RemoteSpec) -> None:
        self.spec = spec
        self._key = spec.api_key()
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._active = 0
        self._tools: dict[str, ToolAsk] = {}  # session -> the tools of its last request (its prefills render them too)

    def _client(self) -> Any:
        """One AsyncOpenAI per event loop: its connection pool belongs to the loop that made it."""
        from openai import AsyncOpenAI  # lazy: only a remote LLM needs the SDK loaded

        loop = asyncio.get_running_loop()
        for old in [l for l in self._clients if l.is_closed()]:
            del self._clients[old]
        if loop not in self._clients:
            self._clients[loop] = AsyncOpenAI(base_url=self.spec.base_url, api_key=self._key,
                                              timeout=self.spec.timeout_s, max_retries=1)  # fmt: skip
        return self._clients[loop]

    def generate(
        self, session_id: str, messages: Sequence[Any], *, max_new_tokens: int,
        temperature: float = 0.0, seed: int | None = None, probe_user_end: bool = False, constraint: Any = None,
        tools: ToolAsk | None = None, top_p: float | None = None, stop: Sequence[str] = (), background: bool = False,
    ) -> RemoteCall:  # fmt: skip
        """`messages`: (role, content) pairs or ChatMessages (a tool round: tool_wire.wire_messages). `tools`: what
        the server may call (passed natively). `constraint` is ignored: the server binds its calls itself.
        `session_id` "" sends no `user` (a request of no conversation). `background` is the local engine's: ignored."""
        if tools is not None and session_id:
            self._tools[session_id] = tools
        fields = {"top_p": top_p, "stop": list(stop) or None}
        return RemoteCall(self._stream(session_id, messages, max(1, max_new_tokens), temperature, seed, tools, fields))

    async def _stream(
        self, session_id: str, messages: Sequence[Any], max_tokens: int, temperature: float, seed: int | None,
        tools: ToolAsk | None, fields: dict[str, Any], calls: bool = True,
    ) -> AsyncIterator[LlmEvent]:  # fmt: skip
        """calls: parse the reply's tool calls (a prefill only renders the tools, and stops after one token)."""
        import openai

        t0 = time.perf_counter()
        first_ms = 0.0
        reason, usage = "stop", None
        more = {k: v for k, v in fields.items() if v is not None}
        if tools is not None:
            more.update(tool_fields(tools.tools, tools.choice, tools.parallel, tools.response_format))
        assembler = CallAssembler(t.name for t in (tools.tools if tools is not None else ()))
        self._active += 1
        try:
            stream = await self._client().chat.completions.create(
                model=self.spec.model, messages=wire_messages(messages), max_tokens=max_tokens,
                temperature=temperature, seed=seed, user=session_id or openai.NOT_GIVEN, stream=True,
                stream_options={"include_usage": True}, extra_headers=trace_headers(), **more,
            )  # fmt: skip
            async with stream:  # leaving closes the response: the server takes it as a cancel
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        if choice.delta.content:
                            first_ms = first_ms or 1000.0 * (time.perf_counter() - t0)
                            yield LlmToken(choice.delta.content)
                        if choice.delta.tool_calls and calls:
                            first_ms = first_ms or 1000.0 * (time.perf_counter() - t0)
                            assembler.feed(choice.delta.tool_calls)
                        if choice.finish_reason:
                            reason = _REASONS.get(choice.finish_reason, "stop")
            if assembler:  # the calls after the content, whole and checked, as our engine writes them
                yield LlmToken(assembler.text())
        except BadToolCall as exc:
            yield LlmError(f"LLM server {self.spec.base_url}: {exc}")
            return
        except (openai.APIError, OSError) as exc:
            yield LlmError(f"LLM server {self.spec.describe(exc)}")
            return
        finally:
            self._active -= 1
        prompt = getattr(usage, "prompt_tokens", 0) or 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
        completion = getattr(usage, "completion_tokens", 0) or 0
        # the remote prefill is not seen apart from the network: submit -> first token stands for it
        yield LlmFinish(reason, first_ms, prompt - cached, cached, max(0, completion - 1), 0.0, None, completion)

    async def prefill(
        self, session_id: str, messages: Sequence[tuple[str, str]], *, probe_user_end: bool = False
    ) -> LlmFinish | LlmError:
        """A 1-token request: the server caches the prompt's prefix for the real one (see the module doc), with the
        tools of the session's last request, which the server renders into that prompt."""
        last: LlmFinish | LlmError = LlmError("no finish event")
        tools = self._tools.get(session_id)
        if tools is not None and tools.choice not in ("auto", "none"):
            tools = ToolAsk(tools.tools, "auto", tools.parallel)  # the same prompt; a forced call would be a wasted token
        async with aclosing(self._stream(session_id, messages, 1, 0.0, None, tools, {}, calls=False)) as events:
            async for event in events:
                if isinstance(event, LlmFinish | LlmError):
                    last = event
        if isinstance(last, LlmFinish):  # a prefill answers nothing: report it as one
            last = LlmFinish("length", last.prefill_ms, last.prefill_tokens, last.reused_tokens, 0, 0.0, None, 0)
        return last

    @property
    def text_even_odds(self) -> float:
        """Never read (probes_user_end is False: a session's turn-taking leaves the text signal out)."""
        return TEXT_EVEN_ODDS

    def system_with_tools(self, system: str, tools: Sequence[ToolSpec]) -> str | None:
        """Never asked (native_tools: the server renders the tools it is sent); here for the stage's shape."""
        return None

    async def warm_grammar(self) -> None:
        """No grammar here: the server binds its own calls."""

    def other_requests(self, session_id: str) -> int:
        """Unknown here (the server's queue is its own): 0, so a first phrase is made ahead as for an idle engine."""
        return 0

    def prefix_cache_counts(self) -> tuple[int, int]:
        """The server's prefix cache is its own: nothing counted here."""
        return 0, 0

    def busy_seconds(self) -> tuple[float, dict[str, float]]:
        """The server's time is its own: admission prices no engine here."""
        return 0.0, {}

    @property
    def decode_path(self) -> str | None:
        """Remote: the server decodes."""
        return None

    def release(self, session_id: str) -> None:
        """The server keeps or evicts the conversation's cache by its own policy."""
        self._tools.pop(session_id, None)

    def active_slots(self) -> int:
        return self._active
