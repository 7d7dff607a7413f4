"""Captured decode step: one CUDA graph per batch-size bucket, replayed with static input buffers.

A graph needs fixed shapes and no host syncs, so the step here attends over the whole cache row with a
mask built on device from the positions, and writes keys/values with tensor indices; it reuses the
model's own modules. On CPU (or disabled) `decode` is the model's plain eager forward. It knows nothing
about requests or sampling.
"""
from __future__ import annotations

import bisect
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from llm_engine.eager import eager_decode
from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


def static_decode_step(
    model: Transformer,
    cache: StaticKVCache,
    tokens: torch.Tensor,  # [B, 1] int64
    input_pos: torch.Tensor,  # [B, 1] int64
    slot_idx: torch.Tensor,  # [B] int64
    key_pos: torch.Tensor,  # [S] int64, arange(cache.max_seq_len)
) -> torch.Tensor:
    """One decode token per row, shapes fixed by B and the cache: -> logits float32 [B, V]."""
    b = tokens.shape[0]
    x = model.embed(tokens)  # [B, 1, hidden]
    ropes = model.rope_at(input_pos, x.dtype)  # cos, sin [B, 1, 1, D], global and local
    mask = (key_pos[None, :] <= input_pos).view(b, 1, 1, -1)  # [B, 1, 1, S]: stale rows past pos stay hidden
    pos = input_pos[:, 0]  # [B]
    windowed = {w: mask & (key_pos[None, :] > input_pos - w).view(b, 1, 1, -1) for w in {blk.self_attn.window for blk in model.layers} if w}
    for block in model.layers:
        attn = block.self_attn
        h = block.input_layernorm(x)
        q, k, v = attn.project(h, *ropes[attn.local_rope])  # [B, H, 1, D], [B, Hkv, 1, D] x2
        cache.write_rows(attn.layer, slot_idx, pos, k[:, :, 0], v[:, :, 0])
        keys, values = (t.to(q.dtype) for t in cache.read_rows(attn.layer, slot_idx))  # [B, Hkv, S, D], int8 dequantized
        layer_mask = windowed[attn.window] if attn.window else mask  # a sliding-window layer sees its last `window` keys
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=layer_mask, enable_gqa=attn.n_kv != attn.n_heads)
        x = block.add_attention(x, attn.o_proj(out.transpose(1, 2).reshape(b, 1, attn.n_heads * attn.head_dim)))
        x = block.add_mlp(x)
    return model.logits(model.norm(x[:, 0]))  # [B, V]


class _Bucket:
    """Static buffers and the captured graph for one batch size."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.tokens = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.input_pos = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.slot_idx = torch.zeros(size, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # [size, V], written by every replay


class GraphedDecoder:
    """A llm_engine.batch.Decoder for B single-token rows (up to the largest bucket), graphed on CUDA.

    Batches are padded to the next bucket by repeating row 0 (same slot, position and token, so the
    extra writes are identical). Graphs are captured lazily per bucket on first use; warm-up writes land
    at the last cache position, which is always rewritten before anyone reads it.
    """

    def __init__(
        self,
        model: Transformer,
        cache: StaticKVCache,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        use_graphs: bool | None = None,
        static_step: bool = False,
    ) -> None:
        """use_graphs: None = on for CUDA. static_step: run the graph-ready step even without graphs (the CPU
        check of what CUDA captures)."""
        self.model, self.cache = model, cache
        self.device = cache.k.device
        self.buckets = sorted(buckets)
        self.max_rows = self.buckets[-1]  # batches are padded up to a bucket
        self.use_graphs = (self.device.type == "cuda") if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model and cache on a CUDA device")
        self._key_pos = torch.arange(cache.max_seq_len, device=self.device)
        self._buckets: dict[int, _Bucket] = {}
        self._pool: object | None = None
        self._step: Callable[..., torch.Tensor] = static_decode_step
        self.static_step = static_step

    @torch.inference_mode()
    def decode(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        b = len(tokens)
        if not self.use_graphs and not self.static_step:
            return eager_decode(self.model, self.cache, tokens, positions, slots)
        size = self.bucket_for(b)
        bucket = self._buckets.get(size) or self._make_bucket(size)
        pad = size - b
        bucket.tokens.copy_(torch.tensor(list(tokens) + [tokens[0]] * pad)[:, None], non_blocking=True)
        bucket.input_pos.copy_(torch.tensor(list(positions) + [positions[0]] * pad)[:, None], non_blocking=True)
        bucket.slot_idx.copy_(torch.tensor(list(slots) + [slots[0]] * pad), non_blocking=True)
        if bucket.graph is None:
            return self._run(bucket)[:b]
        bucket.graph.replay()
        assert bucket.logits is not None
        return bucket.logits[:b]

    def bucket_for(self, batch: int) -> int:
        i = bisect.bisect_left(self.buckets, batch)
        if i == len(self.buckets):
            raise ValueError(f"batch {batch} is larger than the largest bucket {self.buckets[-1]}")
        return self.buckets[i]

    def _run(self, bucket: _Bucket) -> torch.Tensor:
        return self._step(self.model, self.cache, bucket.tokens, bucket.input_pos, bucket.slot_idx, self._key_pos)

    def _make_bucket(self, size: int) -> _Bucket:
        bucket = _Bucket(size, self.device)
        self._buckets[size] = bucket
        if not self.use_graphs:
            return bucket
        bucket.input_pos.fill_(self.cache.max_seq_len - 1)  # warm-up and capture write only there
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # builds lazy kernel layouts (int4 packs) and autotunes before capture
                self._run(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            bucket.logits = self._run(bucket)
        self._pool = graph.pool()  # buckets share one memory pool
        bucket.graph = graph
        return bucket
