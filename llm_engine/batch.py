"""One batched decode forward: one new token per running request, each in its own slot at its own position,
and which forward runs it (the compiled CPU step, captured CUDA graphs, or eager PyTorch).

It knows the model and the cache, nothing about requests, sampling or scheduling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from llm_engine.eager import TorchDecoder
from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer

if TYPE_CHECKING:  # imported lazily at run time: most engines use one at most
    from llm_engine.native.decoder import NativeDecoder


# The longest prompt chunk the compiled step takes (sixteen positions a call). Measured on the 2-core EPYC
# (python -m bench.native_chunks): Qwen2.5-0.5B 7 tokens 70 ms against torch's 108, 16 tokens 173 against 183;
# the 1.5B 7 tokens 186 against 322, 16 tokens 485 against 406: past ~12 torch's batched matmuls win.
NATIVE_PREFILL_MAX = 12


@dataclass(frozen=True)
class DecodeRow:
    slot: int
    token: int  # the token to feed (sampled last step, not yet in the cache)
    pos: int  # where it goes: the number of tokens the slot already holds


class Decoder(Protocol):
    """One decode forward: single-token rows, each in its own slot at its own position -> logits float32 [B, V],
    row i predicting the token after tokens[i]. Each of the three paths (eager PyTorch, captured CUDA graphs, the
    compiled CPU step) is one of these."""

    max_rows: int  # the most rows one call takes

    def decode(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor: ...


class StepDecoder:
    """decode(rows) -> logits [B, V] through the fastest Decoder this model and device allow, chosen once.

    cuda_graphs: replay captured steps (CUDA only). native "auto": the compiled CPU step (llm_engine/native)
    where it can run the model, "on": fail if it cannot, "off": never. `path` says which, and why. A batch larger
    than the fast path takes runs eagerly.
    """

    def __init__(
        self, model: Transformer, cache: StaticKVCache, *, max_slots: int, cuda_graphs: bool = False, native: str = "auto"
    ) -> None:
        if native not in ("auto", "on", "off"):
            raise ValueError(f"native must be auto, on or off, got {native!r}")
        self.eager = TorchDecoder(model, cache)
        self.fast: Decoder | None = None
        self.native: NativeDecoder | None = None
        self.path = "torch"
        if cuda_graphs and cache.k.device.type == "cuda":
            from llm_engine.cuda_graphs import DEFAULT_BUCKETS, GraphedDecoder

            buckets = sorted({b for b in DEFAULT_BUCKETS if b < max_slots} | {max_slots})
            self.fast, self.path = GraphedDecoder(model, cache, buckets=buckets), "graphed"
        elif native != "off":
            from llm_engine.native.decoder import native_decoder

            self.native, self.path = native_decoder(model, cache, required=native == "on")
            self.fast = self.native

    def decode(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        decoder = self.fast if self.fast is not None and len(rows) <= self.fast.max_rows else self.eager
        return decoder.decode([r.token for r in rows], [r.pos for r in rows], [r.slot for r in rows])

    def prefill(self, slot: int, tokens: Sequence[int], start: int, want: Sequence[int]) -> torch.Tensor | None:
        """A short chunk of a prompt through the compiled step -> logits [len(want), V] of the rows `want`; None where
        it should run eagerly (no compiled step, or a chunk long enough that torch's prefill is as fast)."""
        if self.native is None or len(tokens) > NATIVE_PREFILL_MAX:
            return None
        return self.native.prefill(slot, tokens, start, want)
