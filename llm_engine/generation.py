"""One request's life inside the engine: fit the prompt, reuse the slot's cached prefix, prefill, decode steps.

Runs on the engine thread only; returns events instead of delivering them. It knows the model, the
cache and the tokenizer, but nothing about threads, queues or other requests.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from llm_engine.batch import DecodeRow, StepDecoder
from llm_engine.constrain import Guide
from llm_engine.kv_cache import SlotState, StaticKVCache, common_prefix_len
from llm_engine.model import Transformer
from llm_engine.request import ChatMessage, Event, FinishEvent, GenerateRequest, Timings, TokenEvent
from llm_engine.sampling import make_generator, sample
from llm_engine.scheduler import MAX_CHUNK_TOKENS
from llm_engine.tokenizer import StopStringFilter, Tokenizer
from llm_engine.tool_format import ToolSpec


def fit_messages(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], max_prompt_tokens: int, tools: Sequence[ToolSpec] = ()
) -> tuple[list[int], tuple[ChatMessage, ...]] | None:
    """Render the chat; if too long, drop the fewest oldest turns after the system prompt that make it fit (never
    opening on an assistant turn). None if even the last message won't fit. Renders O(log n) times: the history
    kept only shrinks as more is dropped, so the cut is found by bisection (one render when it all fits)."""
    msgs = list(messages)
    head = 1 if msgs and msgs[0].role == "system" else 0
    # never open on an assistant turn, nor on a tool result (its call would be cut off)
    starts = [i for i in range(head, len(msgs)) if msgs[i].role not in ("assistant", "tool") or i == len(msgs) - 1]

    def render(start: int) -> list[int]:
        return tokenizer.apply_chat_template(msgs[:head] + msgs[start:], tools=tools)

    ids = render(head)
    if len(ids) <= max_prompt_tokens:
        return ids, tuple(msgs)
    lo, hi, best = 0, len(starts) - 1, None  # the first start in `starts` whose rendering fits
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = render(starts[mid])
        if len(candidate) <= max_prompt_tokens:
            best, hi = (candidate, starts[mid]), mid - 1
        else:
            lo = mid + 1
    if best is None:
        return None
    return best[0], tuple(msgs[:head] + msgs[best[1] :])


class Generation:
    def __init__(self, req: GenerateRequest, tokenizer: Tokenizer, submitted_s: float, device: torch.device, max_seq_len: int) -> None:
        """Renders and fits the prompt (and finds the probed position) here, on the submitting thread: a long
        history's tokenising never holds up the engine thread's steps for everyone else."""
        self.req = req
        self.tok = tokenizer
        self.params = req.sampling
        self.submitted_s = submitted_s
        self.device = device
        self.generator = make_generator(req.sampling.seed)  # CPU generator: same draws on any device
        self.detok = tokenizer.detokenizer()
        self.stop_filter = StopStringFilter((*tokenizer.stop_strings, *req.sampling.stop))
        self.prompt: list[int] = []
        self.generated: list[int] = []
        self.pending: int | None = None  # sampled but not yet fed through the model
        self.timings = Timings()
        self.prefilled = False  # the whole prompt is in the cache and the first token was sampled
        self.last_chunk = 0  # prompt tokens in the last chunk prefill() ran
        self.probe: tuple[int, frozenset[int]] | None = None  # (prompt index, end token ids), see probe_user_end
        self.end_prob: float | None = None
        self._prefill_started = False
        self.finished = False
        self.guide = Guide(tokenizer, req.constraint) if req.constraint is not None else None  # GrammarError: bad grammar
        reserve = min(self.params.max_new_tokens, max_seq_len // 4)
        fitted = fit_messages(tokenizer, req.messages, max_seq_len - max(reserve, 1), req.tools)
        self.fits = fitted is not None
        self.dropped_messages = 0
        if fitted is not None:
            self.prompt, messages = list(fitted[0]), fitted[1]
            self.dropped_messages = len(req.messages) - len(messages)
            if req.probe_user_end:
                self.probe = tokenizer.user_end_probe(messages, self.prompt, req.tools)

    # -- units of work, each returns the events it produced ---------------------------------------

    def prefill(self, model: Transformer, cache: StaticKVCache, slot: int, state: SlotState,
                max_tokens: int = MAX_CHUNK_TOKENS, step: StepDecoder | None = None) -> list[Event]:  # fmt: skip
        """Run the next chunk (at most max_tokens) of the prompt; the last chunk also samples the first token.

        Chunks let the scheduler interleave a long prompt with other requests' decode steps.
        prefill_ms counts this request's own forwards, not the decode steps interleaved between its chunks.
        A chunk of one token (the usual last one of a turn whose prompt the work ahead cached) runs through `step`,
        the engine's decode forward (the compiled CPU step: ~4.5 ms against ~15 ms eager for SmolLM2-135M), and so
        does a short one (a few words heard ahead, a probe: batch.NATIVE_PREFILL_MAX) where the compiled step runs.
        """
        t0 = time.perf_counter()
        if not self._prefill_started:
            self._prefill_started = True
            if not self.fits:
                return self._finish("context", queue_s=t0)
            # Keep at least the last prompt token to run: its logits choose the first reply token.
            reused = min(common_prefix_len(state.tokens, self.prompt), len(self.prompt) - 1)
            if self.probe is not None:  # the probed position must run through the model, not come from the cache
                reused = min(reused, self.probe[0])
            state.tokens = self.prompt[:reused]
            shared, state.borrowed = min(state.borrowed, reused), 0
            self.timings = replace(self.timings, queue_ms=1000 * (t0 - self.submitted_s), reused_tokens=reused,
                                   shared_prefix_tokens=shared)  # fmt: skip
        start = len(state.tokens)
        chunk = self.prompt[start : start + max(1, min(max_tokens, MAX_CHUNK_TOKENS))]
        self.last_chunk = len(chunk)  # the engine paces its chunks by their cost a token
        tokens = torch.tensor([chunk], device=self.device)  # [1, T]
        pos = torch.arange(start, start + len(chunk), device=self.device)[None]  # [1, T]
        probe_row = self.probe[0] - start if self.probe is not None and start <= self.probe[0] < start + len(chunk) else None
        rows: Sequence[int] | str = "last" if probe_row is None else (probe_row, len(chunk) - 1)
        want = [len(chunk) - 1] if probe_row is None else [probe_row, len(chunk) - 1]
        fast = None
        if step is not None and len(chunk) == 1 and probe_row is None:
            fast = step.decode([DecodeRow(slot, chunk[0], start)])
        elif step is not None:
            fast = step.prefill(slot, chunk, start, want)
        if fast is not None:
            logits = fast[None]  # [1, 1 or 2, V]
        else:
            logits = model(tokens, pos, cache, [slot], rows, kv_len=start + len(chunk))  # [1, 1 or 2, V]
        if probe_row is not None and self.probe is not None:
            end_ids = torch.tensor(sorted(self.probe[1]), device=logits.device)
            self.end_prob = float(torch.softmax(logits[0, 0], dim=-1)[end_ids].sum())
        state.tokens.extend(chunk)
        self.timings = replace(self.timings, prefill_ms=self.timings.prefill_ms + 1000 * (time.perf_counter() - t0))
        if len(state.tokens) < len(self.prompt):
            return []
        self.prefilled = True
        self.timings = replace(self.timings, prefill_tokens=len(self.prompt) - self.timings.reused_tokens)
        if self.params.max_new_tokens <= 0:
            return self._finish("length")
        return self._accept(self._sample(logits[0, -1], self._left(cache, state)), cache, state)

    def decode_input(self, state: SlotState) -> tuple[int, int]:
        """-> (token to feed, its position): the row this request adds to the step's batched forward."""
        assert self.pending is not None and self.prefilled
        return self.pending, len(state.tokens)

    def take_logits(self, logits: torch.Tensor, cache: StaticKVCache, state: SlotState, step_ms: float) -> list[Event]:
        """logits [V]: this request's row of a batched decode forward that fed `pending` -> sample the next token."""
        assert self.pending is not None
        state.tokens.append(self.pending)
        token = self._sample(logits, self._left(cache, state))
        self.timings = replace(
            self.timings, decode_tokens=self.timings.decode_tokens + 1, decode_ms=self.timings.decode_ms + step_ms
        )
        return self._accept(token, cache, state)

    def take_tokens(self, tokens: Sequence[int], cache: StaticKVCache, state: SlotState, step_ms: float) -> list[Event]:
        """Tokens a speculative step emitted after feeding `pending`; all but the last were fed to the model too."""
        assert self.pending is not None and tokens
        events: list[Event] = []
        share_ms = step_ms / len(tokens)
        for token in tokens:
            state.tokens.append(self.pending)
            self.timings = replace(
                self.timings, decode_tokens=self.timings.decode_tokens + 1, decode_ms=self.timings.decode_ms + share_ms
            )
            events += self._accept(token, cache, state)
            if self.finished:
                break
        return events

    def cancel(self) -> list[Event]:
        return [] if self.finished else self._finish("cancelled")

    # -- helpers -----------------------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, left: int) -> int:
        """logits [V] -> the next token, among those the request's grammar (if any) allows; near the limit, one that
        leaves room to close the grammar (constrain.Guide.forced / vet). left: tokens the reply may still add."""
        if self.guide is None:
            return sample(logits, self.params, self.generator, self.history())
        forced = self.guide.forced(left)
        if forced is not None:
            return forced
        return self.guide.vet(sample(self.guide.mask(logits), self.params, self.generator, self.history()), left)

    def _left(self, cache: StaticKVCache, state: SlotState) -> int:
        """The tokens this reply may still add, the one about to be sampled included: max_new_tokens, or the room
        in the context (the token sampled now is the last one if the cache is full: it could not be fed back)."""
        return min(self.params.max_new_tokens - len(self.generated), cache.max_seq_len - len(state.tokens) + 1)

    def history(self) -> list[int]:
        """What the repetition penalty looks at (empty when there is none, to skip the work)."""
        return self.prompt + self.generated if self.params.repetition_penalty != 1.0 else []

    def _accept(self, token: int, cache: StaticKVCache, state: SlotState) -> list[Event]:
        events: list[Event] = []
        if not self.generated:
            first_ms = 1000 * (time.perf_counter() - self.submitted_s)
            self.timings = replace(self.timings, first_token_ms=first_ms)
        # The limit steered a constrained reply to close (Guide.forced / vet): it ends whole, but as the limit made it
        steered = self.guide is not None and self.guide.steered > 0
        if token in self.tok.stop_ids:
            tail = self._tail("")
            if tail:
                events.append(TokenEvent(token, tail))  # text held back for a stop string that never completed
            return events + self._finish("length" if steered else "stop")
        self.generated.append(token)
        piece = self.detok.push(token)
        text, stopped = self.stop_filter.feed(piece)
        if self.guide is not None:
            self.guide.accept(token, piece)
        complete = self.guide is not None and self.guide.done  # the grammar allows nothing more: the reply is whole
        last = stopped or complete or len(self.generated) >= self.params.max_new_tokens or len(state.tokens) >= cache.max_seq_len
        if last and not stopped:
            text = self._tail(text)
        events.append(TokenEvent(token, text))
        if stopped or (complete and not steered):
            return events + self._finish("stop")
        if len(self.generated) >= self.params.max_new_tokens:
            return events + self._finish("length")
        if len(state.tokens) >= cache.max_seq_len:
            return events + self._finish("context")  # no room to feed this token back
        if complete:
            return events + self._finish("length")
        self.pending = token
        return events

    def _tail(self, text: str) -> str:
        more, stopped = self.stop_filter.feed(self.detok.flush())
        return text + more + ("" if stopped else self.stop_filter.flush())

    def _finish(self, reason: str, queue_s: float | None = None) -> list[Event]:
        if queue_s is not None:
            self.timings = replace(self.timings, queue_ms=1000 * (queue_s - self.submitted_s))
        self.finished = True
        return [FinishEvent(reason, self.timings, self.end_prob, len(self.generated), self.dropped_messages)]
