"""One batched decode forward: one new token per running request, each in its own slot at its own position,
and which forward runs it (the compiled CPU step, captured CUDA graphs, or eager PyTorch).

It knows the model and the cache, nothing about requests, sampling or scheduling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer

if TYPE_CHECKING:  # imported lazily at run time: most engines use one at most
    from llm_engine.cuda_graphs import GraphedDecoder
    from llm_engine.native.decoder import NativeDecoder


@dataclass(frozen=True)
class DecodeRow:
    slot: int
    token: int  # the token to feed (sampled last step, not yet in the cache)
    pos: int  # where it goes: the number of tokens the slot already holds


def decode_batch(model: Transformer, cache: StaticKVCache, rows: Sequence[DecodeRow], device: torch.device) -> torch.Tensor:
    """-> logits float32 [B, V], row i predicting the token after rows[i].token.

    Rows differ in length, so keys are read up to the longest row and the model's causal mask
    ([B, 1, 1, kv_len], key position <= the row's own position) hides what lies past each row's end:
    a shorter row never sees stale keys left in its slot by an earlier, longer conversation.
    """
    tokens = torch.tensor([[r.token] for r in rows], device=device)  # [B, 1]
    input_pos = torch.tensor([[r.pos] for r in rows], device=device)  # [B, 1]
    kv_len = max(r.pos for r in rows) + 1  # known host-side: no device sync
    logits = model(tokens, input_pos, cache, [r.slot for r in rows], "last", kv_len=kv_len)  # [B, 1, V]
    return logits[:, -1]


class StepDecoder:
    """decode(rows) -> logits [B, V] through the fastest forward this model and device allow, chosen once.

    cuda_graphs: replay captured steps (CUDA only). native "auto": the compiled CPU step (llm_engine/native)
    where it can run the model, "on": fail if it cannot, "off": never. `path` says which, and why.
    """

    def __init__(
        self, model: Transformer, cache: StaticKVCache, *, max_slots: int, cuda_graphs: bool = False, native: str = "auto"
    ) -> None:
        if native not in ("auto", "on", "off"):
            raise ValueError(f"native must be auto, on or off, got {native!r}")
        self.model, self.cache = model, cache
        self.device = cache.k.device
        self.graphed: GraphedDecoder | None = None
        self.native: NativeDecoder | None = None
        self.path = "torch"
        if cuda_graphs and self.device.type == "cuda":
            from llm_engine.cuda_graphs import DEFAULT_BUCKETS, GraphedDecoder

            buckets = sorted({b for b in DEFAULT_BUCKETS if b < max_slots} | {max_slots})
            self.graphed, self.path = GraphedDecoder(model, cache, buckets=buckets), "graphed"
        elif native != "off":
            from llm_engine.native.decoder import native_decoder

            self.native, self.path = native_decoder(model, cache, required=native == "on")

    def decode(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        if self.native is not None and len(rows) <= self.native.max_rows:
            return self.native.decode([r.token for r in rows], [r.pos for r in rows], [r.slot for r in rows])
        if self.graphed is not None:
            return self.graphed.decode([r.token for r in rows], [r.pos for r in rows], [r.slot for r in rows])
        return decode_batch(self.model, self.cache, rows, self.device)
