"""What flows into and out of the engine: requests, sampling settings, events, timings (frozen dataclasses).

It knows nothing about models, threads or the wire.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llm_engine.constrain import Constraint
from llm_engine.tokenizer import ChatMessage
from llm_engine.tool_format import ToolCall, ToolSpec

__all__ = ["ChatMessage", "ToolCall", "ToolSpec", "SamplingParams", "GenerateRequest", "Timings", "TokenEvent", "FinishEvent", "ErrorEvent", "Event"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off
    seed: int | None = None
    max_new_tokens: int = 256  # 0 = prefill only (prepare the cache ahead of the turn end)
    stop: tuple[str, ...] = ()  # more stop strings, besides the chat template's own; not part of the text


@dataclass(frozen=True)
class GenerateRequest:
    session_id: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # also report FinishEvent.end_prob: how likely the last (user) message is complete as it stands, read from
    # the prompt's own forward (the turn-taking signal of a voice front-end; costs one extra row of the head)
    probe_user_end: bool = False
    # an anonymous request (no conversation of its own, e.g. over HTTP without an affinity key): it may take over
    # the idle slot of another such request whose cache shares the longest prefix with its prompt (a conversation
    # continued), and leaves its own slot to the next one the same way
    share_prefix: bool = False
    # decode under a grammar (structured output, tool calls): every sampled token is one the grammar allows
    constraint: Constraint | None = None
    tools: tuple[ToolSpec, ...] = ()  # rendered into the prompt (llm_engine.tool_format); calls are text until parsed
    # work nobody waits for (a conversation's summary written ahead): its prompt runs after every other one's, in
    # small chunks (scheduler.BatchScheduler.enqueue)
    background: bool = False


@dataclass(frozen=True)
class Timings:
    queue_ms: float = 0.0  # submit -> slot acquired, prefill starts
    prefill_ms: float = 0.0  # prefill forward(s) of the new prompt tokens
    first_token_ms: float = 0.0  # submit -> first token (what the user waits for)
    decode_tokens: int = 0  # tokens from decode steps (the first token comes from prefill)
    decode_ms: float = 0.0  # time spent in those decode steps
    prefill_tokens: int = 0  # prompt tokens actually run through the model
    reused_tokens: int = 0  # prompt tokens whose keys/values came from the cache (the slot's own or copied in)
    shared_prefix_tokens: int = 0  # of those, copied from another session's slot (the prefix cache across slots)

    @property
    def decode_tokens_per_s(self) -> float:
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # clean incremental text delta; may be "" while a character or stop string is incomplete


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # "stop" | "length" | "cancelled" | "context"
    timings: Timings
    end_prob: float | None = None  # with probe_user_end: P(the user's message ends where it does); None if unknown
    generated: int = 0  # tokens of the reply (a stop token not counted): OpenAI's completion_tokens
    dropped_messages: int = 0  # the oldest messages left out so the prompt fit the context (with the reply's room)


@dataclass(frozen=True)
class ErrorEvent:
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent
