"""What the voice pipeline asks of its LLM stage, and what each kind offers, as attributes read directly (never
probed with getattr): voice.llm_bridge.LlmBridge over our engine, voice.remote.llm.RemoteLlm over a chat API.

A capability a kind lacks is still answered, with what it means there (a remote server has no end-of-turn probe, no
slots of ours, no grammar to warm), so callers branch on the answer, not on the object's type.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from llm_engine.tool_format import ToolSpec


class LlmStage(Protocol):
    probes_user_end: bool  # prefill(probe_user_end=True) reads P(the user's turn is finished) (remote: no)
    native_tools: bool  # tools go as a request field (the server renders them); else in the prompt, bound by a grammar
    local_cache: bool  # a prefill fills a cache here, for the cost of the new tokens alone (remote: a whole request)

    @property
    def text_even_odds(self) -> float:
        """The end-of-turn probe's even-odds point for this model (llm_engine.families)."""
        ...

    def generate(self, session_id: str, messages: Sequence[Any], *, max_new_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, probe_user_end: bool = False, constraint: Any = None,
                 tools: Any = None, background: bool = False) -> AsyncIterator[Any]: ...  # fmt: skip

    async def prefill(self, session_id: str, messages: Sequence[tuple[str, str]], *, probe_user_end: bool = False) -> Any: ...

    def system_with_tools(self, system: str, tools: Sequence[ToolSpec]) -> str | None:
        """The system prompt with the tools in the model's own wording, or None (our prompt format)."""
        ...

    async def warm_grammar(self) -> None:
        """Build what a grammar over this model's tokens needs, off the event loop (nothing where there is none)."""
        ...

    def release(self, session_id: str) -> None: ...

    def active_slots(self) -> int: ...

    def other_requests(self, session_id: str) -> int:
        """Requests of other sessions in the LLM now (queued, running or held): is it busy for anyone else?"""
        ...

    def prefix_cache_counts(self) -> tuple[int, int]:
        """(requests that copied a prompt prefix from another session's slot, tokens those copies saved)."""
        ...

    def busy_seconds(self) -> tuple[float, dict[str, float]]:
        """(seconds of LLM work here in all, each session's share of them): admission's and /metrics' engine time
        (remote: (0.0, {}), the server's time is its own)."""
        ...

    @property
    def decode_path(self) -> str | None:
        """Which path decode steps take here, and why (None: the LLM is remote)."""
        ...
