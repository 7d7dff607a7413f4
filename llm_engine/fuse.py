"""Concatenate the projections that read the same input into one layer: q/k/v, and gate/up.

A decode step on CPU is dominated by per-call overhead, not arithmetic: four matmuls per block instead
of seven, and fewer dtype round trips around the quantized kernels (on the 2-core CPU the gain was within
run-to-run noise; fewer, larger launches matter more on a GPU). The fused layer is exact: every scheme
here quantizes row by row, so concatenating rows changes no weight.
It knows layers and blocks; it knows nothing about files or the engine.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from llm_engine.model import Transformer
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear


def _bias(layers: Sequence[nn.Module]) -> torch.Tensor | None:
    biases = [layer.bias for layer in layers]
    ref = next((b for b in biases if b is not None), None)
    if ref is None:
        return None
    return torch.cat([b if b is not None else ref.new_zeros(layer.out_features) for b, layer in zip(biases, layers)])


def concat_rows(layers: Sequence[nn.Module]) -> nn.Module:
    """One layer whose output is the concatenation of the given layers' outputs (same input, same kind)."""
    first = layers[0]
    if not all(type(layer) is type(first) and layer.in_features == first.in_features for layer in layers):
        raise ValueError(f"can only fuse layers of one kind and input size, got {[type(x).__name__ for x in layers]}")
    bias = _bias(layers)
    if isinstance(first, nn.Linear):
        fused = nn.Linear(first.in_features, sum(x.out_features for x in layers), bias=bias is not None)
        fused = fused.to(device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([x.weight for x in layers]))
            if bias is not None:
                fused.bias.copy_(bias)
        return fused.requires_grad_(False)
    if isinstance(first, Int8WeightOnlyLinear):
        return Int8WeightOnlyLinear(
            torch.cat([x.qweight for x in layers]), torch.cat([x.scales for x in layers]), bias, use_kernel=first.use_kernel
        )
    if isinstance(first, Int4WeightOnlyLinear):
        if len({x.group_size for x in layers}) != 1:
            raise ValueError("int4 layers with different group sizes cannot be fused")
        fused4 = Int4WeightOnlyLinear(
            torch.cat([x.codes() for x in layers]),
            torch.cat([x.scales for x in layers]),
            torch.cat([x.minimums for x in layers]),
            first.group_size,
            bias,
            use_kernel=first.use_kernel,
        )
        if all(x.kblocks is not None for x in layers):  # all Q4_K: keep their compact factors
            fused4.kblocks = torch.cat([x.kblocks for x in layers])
        return fused4
    raise ValueError(f"cannot fuse {type(first).__name__}")


def fuse_projections(model: Transformer) -> Transformer:
    """In place, every block: q/k/v -> qkv_proj and gate/up -> gate_up_proj. Idempotent; returns the model."""
    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        if attn.qkv_proj is None:
            attn.qkv_proj = concat_rows([attn.q_proj, attn.k_proj, attn.v_proj])
            del attn.q_proj, attn.k_proj, attn.v_proj
        if mlp.gate_up_proj is None:
            mlp.gate_up_proj = concat_rows([mlp.gate_proj, mlp.up_proj])
            del mlp.gate_proj, mlp.up_proj
    return model
