"""The eager PyTorch decode forward (a llm_engine.batch.Decoder): any model, any device, any number of rows. The
faster paths (captured CUDA graphs, the compiled CPU step) fall back to it for what they cannot take."""
from __future__ import annotations

import sys
from typing import Sequence

import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer


def eager_decode(model: Transformer, cache: StaticKVCache, tokens: Sequence[int], positions: Sequence[int],
                 slots: Sequence[int]) -> torch.Tensor:  # fmt: skip
    """The Decoder contract in plain PyTorch.

    Rows differ in length, so keys are read up to the longest row and the model's causal mask
    ([B, 1, 1, kv_len], key position <= the row's own position) hides what lies past each row's end:
    a shorter row never sees stale keys left in its slot by an earlier, longer conversation.
    """
    device = cache.k.device
    t = torch.tensor(list(tokens), device=device)[:, None]  # [B, 1]
    p = torch.tensor(list(positions), device=device)[:, None]  # [B, 1]
    kv_len = max(positions) + 1  # known host-side: no device sync
    return model(t, p, cache, list(slots), "last", kv_len=kv_len)[:, -1]  # [B, V]


class TorchDecoder:
    """Eager PyTorch: any model, any device, any number of rows."""

    max_rows = sys.maxsize

    def __init__(self, model: Transformer, cache: StaticKVCache) -> None:
        self.model, self.cache = model, cache

    def decode(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        return eager_decode(self.model, self.cache, tokens, positions, slots)
