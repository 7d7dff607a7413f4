"""One request's life inside the engine: fit the prompt, reuse the slot's cached prefix, prefill, decode steps.

Runs on the engine thread only; returns events instead of delivering them. It knows the model, the
cache and the tokenizer, but nothing about threads, queues or other requests.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from llm_engine.kv_cache import SlotState, StaticKVCache, common_prefix_len
from llm_engine.model import Transformer
from llm_engine.request import ChatMessage, Event, FinishEvent, GenerateRequest, Timings, TokenEvent
from llm_engine.sampling import make_generator, sample
from llm_engine.tokenizer import StopStringFilter, Tokenizer

PREFILL_CHUNK = 512  # bounds the [T, kv_len] attention mask and activations for long prompts


def fit_messages(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], max_prompt_tokens: int
) -> tuple[list[int], tuple[ChatMessage, ...]] | None:
    """Render the chat; if too long, drop the oldest turns after the system prompt. None if even the last turn won't fit."""
    msgs = list(messages)
    while True:
        ids = tokenizer.apply_chat_template(msgs)
        if len(ids) <= max_prompt_tokens:
            return ids, tuple(msgs)
        first = next((i for i, m in enumerate(msgs) if m.role != "system"), None)
        if first is None or first == len(msgs) - 1:
            return None
        msgs.pop(first)
        # A conversation must not open with an assistant turn after trimming.
        while first < len(msgs) - 1 and msgs[first].role == "assistant":
            msgs.pop(first)


class Generation:
    def __init__(self, req: GenerateRequest, tokenizer: Tokenizer, submitted_s: float, device: torch.device) -> None:
        self.req = req
        self.tok = tokenizer
        self.params = req.sampling
        self.submitted_s = submitted_s
        self.device = device
        self.generator = make_generator(req.sampling.seed)  # CPU generator: same draws on any device
        self.detok = tokenizer.detokenizer()
        self.stop_filter = StopStringFilter(tokenizer.stop_strings)
        self.prompt: list[int] = []
        self.generated: list[int] = []
        self.pending: int | None = None  # sampled but not yet fed through the model
        self.timings = Timings()
        self.finished = False

    # -- units of work, each returns the events it produced ---------------------------------------

    def prefill(self, model: Transformer, cache: StaticKVCache, slot: int, state: SlotState) -> list[Event]:
        t0 = time.perf_counter()
        reserve = min(self.params.max_new_tokens, cache.max_seq_len // 4)
        fitted = fit_messages(self.tok, self.req.messages, cache.max_seq_len - max(reserve, 1))
        if fitted is None:
            return self._finish("context", queue_s=t0)
        ids, _ = fitted
        # Keep at least the last prompt token to run: its logits choose the first reply token.
        reused = min(common_prefix_len(state.tokens, ids), len(ids) - 1)
        state.tokens = ids[:reused]
        for start in range(reused, len(ids), PREFILL_CHUNK):
            chunk = ids[start : start + PREFILL_CHUNK]
            tokens = torch.tensor([chunk], device=self.device)  # [1, T]
            pos = torch.arange(start, start + len(chunk), device=self.device)[None]  # [1, T]
            logits = model(tokens, pos, cache, [slot], "last", kv_len=start + len(chunk))  # [1, 1, V]
            state.tokens.extend(chunk)
        self.prompt = ids
        t1 = time.perf_counter()
        self.timings = replace(
            self.timings,
            queue_ms=1000 * (t0 - self.submitted_s),
            prefill_ms=1000 * (t1 - t0),
            prefill_tokens=len(ids) - reused,
            reused_tokens=reused,
        )
        if self.params.max_new_tokens <= 0:
            return self._finish("length")
        return self._accept(sample(logits[0, -1], self.params, self.generator, self._history()), cache, state)

    def step(self, model: Transformer, cache: StaticKVCache, slot: int, state: SlotState) -> list[Event]:
        assert self.pending is not None
        t0 = time.perf_counter()
        pos = len(state.tokens)
        tokens = torch.tensor([[self.pending]], device=self.device)  # [1, 1]
        logits = model(tokens, torch.tensor([[pos]], device=self.device), cache, [slot], "last", kv_len=pos + 1)
        state.tokens.append(self.pending)
        token = sample(logits[0, -1], self.params, self.generator, self._history())
        self.timings = replace(
            self.timings,
            decode_tokens=self.timings.decode_tokens + 1,
            decode_ms=self.timings.decode_ms + 1000 * (time.perf_counter() - t0),
        )
        return self._accept(token, cache, state)

    def cancel(self) -> list[Event]:
        return [] if self.finished else self._finish("cancelled")

    # -- helpers -----------------------------------------------------------------------------------

    def _history(self) -> list[int]:
        return self.prompt + self.generated if self.params.repetition_penalty != 1.0 else []

    def _accept(self, token: int, cache: StaticKVCache, state: SlotState) -> list[Event]:
        events: list[Event] = []
        if not self.generated:
            first_ms = 1000 * (time.perf_counter() - self.submitted_s)
            self.timings = replace(self.timings, first_token_ms=first_ms)
        if token in self.tok.stop_ids:
            tail = self._tail("")
            if tail:
                events.append(TokenEvent(token, tail))  # text held back for a stop string that never completed
            return events + self._finish("stop")
        self.generated.append(token)
        text, stopped = self.stop_filter.feed(self.detok.push(token))
        last = stopped or len(self.generated) >= self.params.max_new_tokens or len(state.tokens) >= cache.max_seq_len
        if last and not stopped:
            text = self._tail(text)
        events.append(TokenEvent(token, text))
        if stopped:
            return events + self._finish("stop")
        if len(self.generated) >= self.params.max_new_tokens:
            return events + self._finish("length")
        if len(state.tokens) >= cache.max_seq_len:
            return events + self._finish("context")  # no room to feed this token back
        self.pending = token
        return events

    def _tail(self, text: str) -> str:
        more, stopped = self.stop_filter.feed(self.detok.flush())
        return text + more + ("" if stopped else self.stop_filter.flush())

    def _finish(self, reason: str, queue_s: float | None = None) -> list[Event]:
        if queue_s is not None:
            self.timings = replace(self.timings, queue_ms=1000 * (queue_s - self.submitted_s))
        self.finished = True
        return [FinishEvent(reason, self.timings)]
