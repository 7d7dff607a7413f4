"""Static KV cache with per-session slots, and the pure bookkeeping of which session owns which slot.

The cache knows tensors and positions; SlotTable knows sessions, cached token ids and LRU order.
Neither knows the model or the scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


MIN_SHARED_PREFIX = 16  # fewer shared tokens are not worth a copy across slots


class StaticKVCache:
    """Preallocated keys/values: [layers, slots, kv_heads, max_seq, head_dim] each, never resized.

    A fixed shape is what lets a captured CUDA-graph decode step and batched slots slot in later.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len

    def write(self, layer: int, slots: Sequence[int], input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [B, kv_heads, T, head_dim] written at input_pos [B, T] of each row's slot, in the cache's dtype."""
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)  # no-op unless the cache is narrower than the model
        if len(slots) == 1:
            # Fast path: one slot, contiguous positions (prefill or decode) -> a plain slice copy.
            start = int(input_pos[0, 0])
            t = k.shape[2]
            self.k[layer, slots[0], :, start : start + t] = k[0]
            self.v[layer, slots[0], :, start : start + t] = v[0]
            return
        slot_idx = torch.tensor(list(slots), device=k.device)[:, None]  # [B, 1]
        # Advanced indices split by a slice put their broadcast dims first: target is [B, T, kv_heads, head_dim].
        self.k[layer][slot_idx, :, input_pos] = k.transpose(1, 2)
        self.v[layer][slot_idx, :, input_pos] = v.transpose(1, 2)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Positions [0, n) of slot src, every layer, into slot dst (the prefix cache across slots)."""
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]

    def read(self, layer: int, slots: Sequence[int], kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> keys, values [B, kv_heads, kv_len, head_dim]; a view (no copy) for a single slot."""
        if len(slots) == 1:
            s = slots[0]
            return self.k[layer, s : s + 1, :, :kv_len], self.v[layer, s : s + 1, :, :kv_len]
        idx = torch.tensor(list(slots), device=self.k.device)
        return self.k[layer, idx, :, :kv_len], self.v[layer, idx, :, :kv_len]


@dataclass
class SlotState:
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)  # token ids whose keys/values the slot holds, in order
    busy: bool = False  # a request is running in it: never evicted
    last_used: int = 0  # logical clock for LRU eviction
    shared: bool = False  # held for an anonymous request: another may take it over by prefix (acquire)
    borrowed: int = 0  # leading tokens copied in from another slot for the request now starting (prefix cache)


class SlotTable:
    """Which session owns which slot, what each slot holds, and who gets evicted (pure, no tensors)."""

    def __init__(self, num_slots: int) -> None:
        self.slots = [SlotState() for _ in range(num_slots)]
        self._clock = 0

    def slot_of(self, session_id: str) -> int | None:
        for i, s in enumerate(self.slots):
            if s.session_id == session_id:
                return i
        return None

    def acquire(self, session_id: str, prompt: Sequence[int] = (), *, shared: bool = False) -> int | None:
        """The session's own slot, else a free one, else the least-recently-used idle one; None if all are busy.

        shared (an anonymous request): first, the idle shared slot whose cache shares the longest prefix with
        `prompt`, if any does; the slot stays shared."""
        own = self.slot_of(session_id)
        if own is not None:
            return None if self.slots[own].busy else self._take(own, session_id, keep=True, shared=shared)
        if shared:
            best, best_len = None, 0
            for i, s in enumerate(self.slots):
                n = common_prefix_len(s.tokens, prompt) if s.shared and not s.busy else 0
                if n > best_len:
                    best, best_len = i, n
            if best is not None:
                return self._take(best, session_id, keep=True, shared=True)
        for i, s in enumerate(self.slots):
            if s.session_id is None:
                return self._take(i, session_id, keep=False, shared=shared)
        idle = [i for i, s in enumerate(self.slots) if not s.busy]
        if not idle:
            return None
        return self._take(min(idle, key=lambda i: self.slots[i].last_used), session_id, keep=False, shared=shared)

    def prefix_donor(self, slot: int, prompt: Sequence[int], min_tokens: int = MIN_SHARED_PREFIX) -> tuple[int, int] | None:
        """The prefix cache across slots: -> (donor slot, n) when another idle slot holds the first n tokens of
        `prompt` (a persona's system prompt another session already ran, above all) and that is at least
        min_tokens more than `slot` holds itself; the donor counts as used (LRU). None otherwise."""
        own = common_prefix_len(self.slots[slot].tokens, prompt)
        best, best_len = None, own + min_tokens - 1
        for i, s in enumerate(self.slots):
            if i != slot and not s.busy and s.tokens:
                n = common_prefix_len(s.tokens, prompt)
                if n > best_len:
                    best, best_len = i, n
        if best is None:
            return None
        self._clock += 1
        self.slots[best].last_used = self._clock
        return best, best_len

    def _take(self, i: int, session_id: str, *, keep: bool, shared: bool) -> int:
        s = self.slots[i]
        if not keep:
            s.tokens = []  # an evicted slot's contents belong to someone else: reuse nothing
        s.session_id = session_id
        s.shared = shared
        s.borrowed = 0
        s.busy = True
        self._clock += 1
        s.last_used = self._clock
        return i

    def finish(self, slot: int) -> None:
        """The request in this slot ended; the session keeps the slot (and its cache) until released or evicted."""
        self.slots[slot].busy = False
        self._clock += 1
        self.slots[slot].last_used = self._clock

    def release(self, session_id: str) -> bool:
        i = self.slot_of(session_id)
        if i is None:
            return False
        if self.slots[i].busy:
            return False  # the engine frees it when the running request ends
        self.slots[i] = SlotState()
        return True

    def owned(self) -> int:
        return sum(1 for s in self.slots if s.session_id is not None)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
