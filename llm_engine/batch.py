"""One batched decode forward: one new token per running request, each in its own slot at its own position.

It knows the model and the cache, nothing about requests, sampling or scheduling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer


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
