"""llama.cpp's 5- and 8-bit blocks (Q5_0, Q8_0) unpacked with numpy: codes and their block scales, and the floats
they stand for (exactly what gguf-py's dequantize computes, tested on the real files; faster on big tensors).
It knows bytes and shapes, nothing about models.
"""
from __future__ import annotations

import numpy as np

GGUF_GROUP = 32  # weights per block
Q8_0_BLOCK_BYTES = 34  # fp16 d, 32 int8
Q5_0_BLOCK_BYTES = 22  # fp16 d, 32 fifth bits, 16 bytes of nibbles


def unpack_q8_0(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """raw [rows, cols/32*34] uint8 -> codes [rows, cols] int8, scales [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q8_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return q, d


def unpack_q5_0(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """raw [rows, cols/32*22] uint8 -> codes [rows, cols] int8 in -16..15 (w = code * d), scales [rows, cols/32] f32."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GGUF_GROUP, Q5_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    fifth = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")  # [rows, G, 32]: weight j's fifth bit
    qs = blocks[..., 6:]  # [rows, G, 16]: low nibbles are weights 0..15, high nibbles 16..31
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1) | (fifth << 4)  # [rows, G, 32] uint8, 0..31
    return (codes.view(np.int8) - np.int8(16)).reshape(rows, cols), d


def wide_floats(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    """Q5_0 and Q8_0 blocks -> float32 [rows, cols] (codes times their block's scale, as gguf's dequantize computes
    them, without its per-type Python overhead); None for other types."""
    unpack = {"Q5_0": unpack_q5_0, "Q8_0": unpack_q8_0}.get(kind)
    if unpack is None:
        return None
    q, d = unpack(raw, rows, cols)
    w = q.reshape(rows, cols // GGUF_GROUP, GGUF_GROUP).astype(np.float32)
    w *= d[..., None]
    return w.reshape(rows, cols)
