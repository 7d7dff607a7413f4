"""Reads llama.cpp Q4_1 / Q8_0 blocks straight out of a GGUF file into our quantized Linear layers.

Q4_1 (32 weights: fp16 scale d, fp16 minimum m, 4-bit codes; w = q*d + m) is exactly our asymmetric
int4 with group 32, so the codes are copied, never rounded. Q8_0 (32 weights, one fp16 scale) has no
exact per-channel int8 equivalent and is requantized per channel. It knows nothing about the engine.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear, Scheme

Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
Q8_0_BLOCK_BYTES = 34  # fp16 d, 32 int8
GGUF_GROUP = 32


def unpack_q4_1(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw [rows, cols/32*20] uint8 -> codes [rows, cols] uint8, scales [rows, cols/32] f32, minimums [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]  # [rows, G, 16]: low nibbles are weights 0..15 of the block, high nibbles 16..31
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(rows, cols)
    return codes.astype(np.uint8), d, m


def unpack_q8_0(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """raw [rows, cols/32*34] uint8 -> codes [rows, cols] int8, scales [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q8_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return q, d


def read_quantized_linears(
    gguf_path: str | Path, scheme: Scheme, *, use_kernel: bool = True
) -> dict[str, nn.Module]:
    """-> {our module path ("layers.0.mlp.up_proj"): quantized layer} for every Q4_1/Q8_0 projection the scheme allows.

    int4 takes Q4_1 blocks as they are; int8 takes Q8_0 blocks (per-channel requantized). Other pairs are
    left out, and quantize_model quantizes those layers from the float weights.
    """
    from gguf import GGMLQuantizationType, GGUFReader

    from llm_engine.gguf_loader import config_from_gguf, hf_name, unpermute_qk, _field_value

    reader = GGUFReader(str(gguf_path))
    meta = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    names = {t.name for t in reader.tensors}
    cfg = config_from_gguf(meta, tied="output.weight" not in names)
    out: dict[str, nn.Module] = {}
    for t in reader.tensors:
        name = hf_name(t.name).removeprefix("model.")
        if not name.startswith("layers.") or not name.endswith("_proj.weight"):
            continue
        cols, rows = int(t.shape[0]), int(t.shape[1])  # GGUF lists dims innermost first
        heads = cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads
        # llama.cpp permuted Q/K rows; the permutation is over whole rows, so codes and scales follow it.
        fix = (lambda a: unpermute_qk(a, heads)) if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")) else (lambda a: a)
        path = name.removesuffix(".weight")
        if scheme == "int4" and t.tensor_type == GGMLQuantizationType.Q4_1:
            codes, d, m = unpack_q4_1(t.data, rows, cols)
            out[path] = Int4WeightOnlyLinear(
                torch.from_numpy(fix(codes).copy()), torch.from_numpy(fix(d).copy()), torch.from_numpy(fix(m).copy()),
                GGUF_GROUP, use_kernel=use_kernel,
            )
        elif scheme == "int8" and t.tensor_type == GGMLQuantizationType.Q8_0:
            q, d = unpack_q8_0(t.data, rows, cols)
            w = torch.from_numpy(fix(q).astype(np.float32) * np.repeat(fix(d), GGUF_GROUP, axis=1))
            out[path] = Int8WeightOnlyLinear.from_float(w, use_kernel=use_kernel)
    return out
