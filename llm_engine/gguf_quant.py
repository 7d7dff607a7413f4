"""Reads llama.cpp's 4-bit and Q8_0 blocks straight out of a GGUF file into our quantized Linear layers.

Our int4 layer is asymmetric with group 32: w = q * scale + minimum, q in 0..15. Three GGUF types are
exactly that, so their codes are copied, never rounded:
- Q4_1 (32 weights: fp16 scale d, fp16 minimum m, 4-bit codes): scale d, minimum m.
- Q4_0 (32 weights: fp16 scale d, 4-bit codes; w = (q - 8) * d): scale d, minimum -8d.
- Q4_K (256 weights: fp16 d and dmin, eight 6-bit (scale, min) pairs, 4-bit codes; w = q * d*sc - dmin*mn):
  scale d*sc, minimum -dmin*mn per 32 weights (float32, as llama.cpp computes them).
Q8_0 (32 weights, one fp16 scale) has no exact per-channel int8 equivalent and is requantized per channel.
Under int4, the projections stored in more than 4 bits (Q5_0, Q5_K, Q6_K, Q8_0) become int8 per channel, unless
a projection they are fused with (q/k/v, gate/up) is taken in 4 bits as stored; 4 bits would lose what the file
kept (Gemma 3 270M's Q4_K_M: logit cosine 0.952 against the file's own floats requantized, 0.998 in int8).
The float types are quantized as `llm.quant` asks (quantize.py).
It knows nothing about the engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from llm_engine.config import ModelConfig
from llm_engine.gguf_blocks import GGUF_GROUP, unpack_q8_0
from llm_engine.quantize import Int4WeightOnlyLinear, Int8Head, Int8WeightOnlyLinear, Scheme

Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
Q4_0_BLOCK_BYTES = 18  # fp16 d, 16 bytes of nibbles
Q4_K_BLOCK_BYTES = 144  # fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of nibbles
Q4_K_WEIGHTS = 256


def unpack_q4_1(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw [rows, cols/32*20] uint8 -> codes [rows, cols] uint8, scales [rows, cols/32] f32, minimums [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]  # [rows, G, 16]: low nibbles are weights 0..15 of the block, high nibbles 16..31
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(rows, cols)
    return codes.astype(np.uint8), d, m


def unpack_q4_0(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw [rows, cols/32*18] uint8 -> codes [rows, cols] uint8, scales and minimums [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q4_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    qs = blocks[..., 2:]  # [rows, G, 16]: low nibbles are weights 0..15, high nibbles 16..31
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(rows, cols)
    return codes.astype(np.uint8), d, -8.0 * d


def unpack_q4_k(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw [rows, cols/256*144] uint8 -> codes [rows, cols] uint8, scales and minimums [rows, cols/32] f32."""
    codes, scales, minimums, _ = _q4_k(raw, rows, cols)
    return codes, scales, minimums


def _q4_k(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """unpack_q4_k's three, and the compact factors [rows, cols/256, 24] uint8: per super-block the 6-bit (scale,
    min) multipliers interleaved, then d and -dmin as float32 (the compiled step's KBlock)."""
    nb = cols // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw).reshape(rows, nb, Q4_K_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)[..., None]  # [rows, nb, 1]
    dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)[..., None]
    sm = blocks[..., 4:16].astype(np.uint8)  # [rows, nb, 12]
    # Sub-blocks 0..3 keep 6 bits each in bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 keep their low
    # 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits in the top of bytes 0..7.
    sc = np.concatenate([sm[..., 0:4] & 63, (sm[..., 8:12] & 0xF) | ((sm[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([sm[..., 4:8] & 63, (sm[..., 8:12] >> 4) | ((sm[..., 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:].reshape(rows, nb, 4, 32)  # four runs of 32 bytes: low nibbles one sub-block, high the next
    codes = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(rows, cols)  # [rows, nb, 4, 2, 32] in weight order
    scales = (d * sc.astype(np.float32)).reshape(rows, nb * 8)
    minimums = -(dmin * mn.astype(np.float32)).reshape(rows, nb * 8)
    factors = np.concatenate([np.stack([sc, mn], axis=-1).reshape(rows, nb, 16).astype(np.uint8),
                              d.astype(np.float32).view(np.uint8), (-dmin).astype(np.float32).view(np.uint8)], axis=-1)  # fmt: skip
    return codes.astype(np.uint8), scales, minimums, factors


_INT4_EXACT = {"Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1, "Q4_K": unpack_q4_k}
WIDE_TYPES = ("Q5_0", "Q5_K", "Q6_K", "Q8_0")  # more than 4 bits a weight: int8 under int4 where they can be
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # fuse.py's groups: one layer kind each


def kept_wide(types: dict[str, str]) -> set[str]:
    """{module path: GGUF type} of the projections -> the paths int4 keeps in int8: a WIDE_TYPES projection none
    of whose fusion partners is taken in 4 bits as stored."""
    out = set()
    for path, kind in types.items():
        if kind not in WIDE_TYPES or not (path.startswith("layers.") and path.endswith("_proj")):
            continue
        prefix, leaf = path.rsplit(".", 1)
        group = next((g for g in _FUSED if leaf in g), (leaf,))
        if not any(types.get(f"{prefix}.{member}") in _INT4_EXACT for member in group):
            out.add(path)
    return out


@dataclass
class GgufWeights:
    cfg: ModelConfig
    floats: dict[str, torch.Tensor]  # Hugging Face name -> float32 tensor, for every tensor not in `layers`
    layers: dict[str, nn.Module]  # our module path ("layers.0.mlp.up_proj", "lm_head") -> quantized layer as stored


def read_quantized_linears(gguf_path: str | Path, scheme: Scheme, *, use_kernel: bool = True) -> dict[str, nn.Module]:
    """-> {our module path: quantized layer} for every projection the scheme takes as stored (read_gguf's layers)."""
    return read_gguf(gguf_path, scheme, use_kernel=use_kernel, floats=False).layers


def read_gguf(gguf_path: str | Path, scheme: Scheme, *, use_kernel: bool = True, floats: bool = True, reader: Any = None,
              int8: dict[str, torch.Tensor] | None = None) -> GgufWeights:
    """One pass over a GGUF: the quantized layers the scheme takes as stored, and (floats) every other tensor
    dequantized, so a quantized model is built without a float copy of its 4-bit projections.

    int4 takes Q4_0, Q4_1 and Q4_K blocks as they are and the wider types in int8 (kept_wide); int8 takes Q8_0 blocks
    (per-channel requantized). Other pairs are left to quantize_model, from the float weights. The output head
    ("lm_head": the output tensor, or the embedding of a tied model) is taken as int4 when the file stores it in 4 bits: its author chose that; otherwise
    quantize_model gives it int8 (Q8_0 and Q6_K heads, as most files have).
    int8: {path.qweight, path.scales} of int8 layers an earlier load made from this file (loader.INT8_CACHE): taken
    as they are instead of requantized (the head among them).
    """
    from gguf import GGMLQuantizationType

    from llm_engine.gguf_file import GgufFile
    from llm_engine.gguf_loader import ROPE_FREQS, dequantized, hf_name, read_config, unpermute_qk

    reader = reader or GgufFile(gguf_path)
    cfg = read_config(reader, Path(gguf_path))
    out = GgufWeights(cfg, {}, {})
    head = "token_embd.weight" if cfg.tie_word_embeddings else "output.weight"
    types = {hf_name(t.name, cfg.architecture).removeprefix("model.").removesuffix(".weight"): t.tensor_type.name
             for t in reader.tensors if t.name.endswith(".weight") and t.name != ROPE_FREQS}  # fmt: skip
    wide = kept_wide(types) if scheme == "int4" else set()
    for t in reader.tensors:
        if t.name == ROPE_FREQS:
            continue  # in the config
        kind, rows, cols = t.tensor_type.name, int(t.shape[-1]), int(t.shape[0])  # GGUF lists dims innermost first
        name = hf_name(t.name, cfg.architecture).removeprefix("model.")
        path = "lm_head" if t.name == head else name.removesuffix(".weight")
        if path != "lm_head" and not (name.startswith("layers.") and name.endswith("_proj.weight")):
            path = ""  # not a layer the scheme could take as stored
        heads = cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads
        # llama.cpp permuted Q/K rows; the permutation is over whole rows, so codes and scales follow it.
        permuted = cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight"))
        fix = (lambda a: unpermute_qk(a, heads)) if permuted else (lambda a: a)
        if path and scheme == "int4" and kind in _INT4_EXACT:
            records = None
            if kind == "Q4_K":  # one unpack gives both the pairs and the compact factors
                codes, d, m, records = _q4_k(t.data, rows, cols)
            else:
                codes, d, m = _INT4_EXACT[kind](t.data, rows, cols)
            layer = Int4WeightOnlyLinear(torch.from_numpy(fix(codes).copy()), torch.from_numpy(fix(d).copy()),
                                         torch.from_numpy(fix(m).copy()), GGUF_GROUP, use_kernel=use_kernel)  # fmt: skip
            if records is not None:
                layer.kblocks = torch.from_numpy(fix(records).copy())
            out.layers[path] = layer
        elif int8 is not None and f"{path}.qweight" in int8:
            kind8 = Int8Head if path == "lm_head" else Int8WeightOnlyLinear
            # copies: tensors read by safetensors share one buffer at unaligned offsets, where torch's int8 pack kernel
            # faults (seen: a segmentation fault on the first matmul)
            out.layers[path] = kind8(int8[f"{path}.qweight"].clone(), int8[f"{path}.scales"].clone(), None, use_kernel=use_kernel)
        elif path in wide:
            out.layers[path] = Int8WeightOnlyLinear.from_float(dequantized(t, cfg), use_kernel=use_kernel)
        elif path and path != "lm_head" and scheme == "int8" and t.tensor_type == GGMLQuantizationType.Q8_0:
            q, d = unpack_q8_0(t.data, rows, cols)
            w = torch.from_numpy(fix(q).astype(np.float32) * np.repeat(fix(d), GGUF_GROUP, axis=1))
            out.layers[path] = Int8WeightOnlyLinear.from_float(w, use_kernel=use_kernel)
        if floats and (path not in out.layers or t.name == "token_embd.weight"):  # a tied head's embedding: both
            out.floats[hf_name(t.name, cfg.architecture)] = dequantized(t, cfg)
    return out
