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
    dtype torch.int8 keeps each key and value row (one head at one position) as int8 codes with a float32
    scale (symmetric: row = codes * scale, scale = max |row| / 127) in k_scale / v_scale [layers, slots,
    kv_heads, max_seq], of the row rotated by `rotation` (an orthogonal Hadamard transform over head_dim:
    it spreads a few large channels, which SmolLM2's keys have, over all of them, so the one scale per row
    loses less; measured on SmolLM2, logits cosine vs float16 0.9976 -> 0.9998 at the first step). Reads
    dequantize and rotate back, so every path sees the same stored values.
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
        self.quantized = dtype == torch.int8
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self.rotation: torch.Tensor | None = None
        if self.quantized:
            self.k_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=device)
            self.v_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=device)
            self.rotation = hadamard(head_dim).to(device)
        elif dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"a KV cache holds float32, float16, bfloat16 or int8, not {dtype}")
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds, scales included."""
        scales = sum(t.nbytes for t in (self.k_scale, self.v_scale) if t is not None)
        return self.k.nbytes + self.v.nbytes + scales

    def write(self, layer: int, slots: Sequence[int], input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [B, kv_heads, T, head_dim] written at input_pos [B, T] of each row's slot, in the cache's dtype."""
        if self.quantized:
            (k, ks), (v, vs) = self._encode(k), self._encode(v)
        else:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)  # no-op unless the cache is narrower than the model
        if len(slots) == 1:
            # Fast path: one slot, contiguous positions (prefill or decode) -> a plain slice copy.
            start = int(input_pos[0, 0])
            t = k.shape[2]
            self.k[layer, slots[0], :, start : start + t] = k[0]
            self.v[layer, slots[0], :, start : start + t] = v[0]
            if self.k_scale is not None and self.v_scale is not None:
                self.k_scale[layer, slots[0], :, start : start + t] = ks[0]
                self.v_scale[layer, slots[0], :, start : start + t] = vs[0]
            return
        slot_idx = torch.tensor(list(slots), device=k.device)[:, None]  # [B, 1]
        # Advanced indices split by a slice put their broadcast dims first: target is [B, T, kv_heads, head_dim].
        self.k[layer][slot_idx, :, input_pos] = k.transpose(1, 2)
        self.v[layer][slot_idx, :, input_pos] = v.transpose(1, 2)
        if self.k_scale is not None and self.v_scale is not None:
            self.k_scale[layer][slot_idx, :, input_pos] = ks.transpose(1, 2)
            self.v_scale[layer][slot_idx, :, input_pos] = vs.transpose(1, 2)

    def write_rows(self, layer: int, slot_idx: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One position per row, all indices as device tensors (no host sync, so a CUDA graph can hold it):
        k, v [B, kv_heads, head_dim] at position pos [B] of slot slot_idx [B]."""
        if self.quantized:
            (k, ks), (v, vs) = self._encode(k), self._encode(v)
            assert self.k_scale is not None and self.v_scale is not None
            self.k_scale[layer][slot_idx, :, pos] = ks  # advanced indices around a slice: target is [B, kv_heads]
            self.v_scale[layer][slot_idx, :, pos] = vs
        self.k[layer][slot_idx, :, pos] = k.to(self.k.dtype)  # target [B, kv_heads, head_dim]
        self.v[layer][slot_idx, :, pos] = v.to(self.v.dtype)

    def read_rows(self, layer: int, slot_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> keys, values [B, kv_heads, max_seq, head_dim] of the slots slot_idx [B] (a device tensor), whole rows."""
        if self.k_scale is not None and self.v_scale is not None:
            return (self._decode(self.k[layer][slot_idx], self.k_scale[layer][slot_idx]),
                    self._decode(self.v[layer][slot_idx], self.v_scale[layer][slot_idx]))  # fmt: skip
        return self.k[layer][slot_idx], self.v[layer][slot_idx]

    def stored(self) -> list[torch.Tensor]:
        """The tensors that hold the cache, each [layers, slots, kv_heads, max_seq, ...]: keys, values (and scales)."""
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]

    def save_prefix(self, slot: int, n: int) -> list[torch.Tensor]:
        """A copy of positions [0, n) of `slot`, every layer, as stored (for load_prefix)."""
        return [t[:, slot, :, :n].clone() for t in self.stored()]

    def load_prefix(self, saved: Sequence[torch.Tensor], dst: int, n: int) -> None:
        """The first n positions of what save_prefix returned into slot dst."""
        for t, s in zip(self.stored(), saved, strict=True):
            t[:, dst, :, :n] = s[:, :, :n]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Positions [0, n) of slot src, every layer, into slot dst (the prefix cache across slots), as stored."""
        for t in self.stored():
            t[:, dst, :, :n] = t[:, src, :, :n]

    def read(self, layer: int, slots: Sequence[int], kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> keys, values [B, kv_heads, kv_len, head_dim]; a view (no copy) for a single slot of a float cache,
        float32 dequantized from an int8 one."""
        if len(slots) == 1:
            s = slots[0]
            index: slice | torch.Tensor = slice(s, s + 1)
        else:
            index = torch.tensor(list(slots), device=self.k.device)
        k, v = self.k[layer, index, :, :kv_len], self.v[layer, index, :, :kv_len]
        if self.k_scale is not None and self.v_scale is not None:
            return (self._decode(k, self.k_scale[layer, index, :, :kv_len]),
                    self._decode(v, self.v_scale[layer, index, :, :kv_len]))  # fmt: skip
        return k, v

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.rotation is not None
        return quantize_rows(x.float() @ self.rotation)

    def _decode(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        assert self.rotation is not None
        return dequantize(codes, scale) @ self.rotation  # the rotation is its own inverse


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (int8 codes [..., head_dim], float32 scales [...]): symmetric per row,
    scale = max |x| / 127, codes = round(x / scale) (half to even); an all-zero row gets scale 0, codes 0.
    decode.cpp quantizes the same way, operation for operation."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / 127.0
    codes = torch.where(scale[..., None] > 0, xf / scale[..., None], torch.zeros_like(xf))
    return codes.round().clamp(-127, 127).to(torch.int8), scale


def hadamard(n: int) -> torch.Tensor:
    """-> [n, n] float32 block-diagonal Walsh-Hadamard matrix / sqrt(block), blocks of the largest power of two
    dividing n: symmetric and orthogonal (its own inverse). decode.cpp applies the same as a butterfly."""
    block = n & -n
    h = torch.ones(1, 1)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.block_diag(*[h / block**0.5] * (n // block))


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 codes [..., head_dim] and scales [...] -> float32 values."""
    return codes.float() * scale[..., None]


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
