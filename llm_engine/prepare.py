"""From a model file and the config's names to what an Engine runs: the model loaded, quantized and fused,
an optional quantized self-draft, its tokenizer, and the KV cache's element type.

It checks the dtype, quantization and cache names before loading anything, so those fail at once. It
knows loaders and layer rewrites; it knows nothing about requests, slots or threads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from llm_engine.families import Family, family_of_folder
from llm_engine.fuse import fuse_projections
from llm_engine.loader import DTYPES, load_gguf_quantized, load_model, resolve_dtype, save_int8_layers
from llm_engine.model import Transformer
from llm_engine.quantize import SCHEMES, quantize_model
from llm_engine.tokenizer import Tokenizer

KV_DTYPES = ("auto", *DTYPES, "int8")  # int8: codes with a float32 scale per head and position


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """The cache's element type for a config name. "auto": float16 under a float32 model on CPU (half the
    cache's memory, and half of what each decode step of a long conversation reads; llama.cpp's default
    too), otherwise the model's own dtype."""
    if name not in KV_DTYPES:
        raise ValueError(f"kv cache dtype must be one of {KV_DTYPES}, got {name!r}")
    if name == "auto":
        return torch.float16 if torch.device(device).type == "cpu" and model_dtype == torch.float32 else model_dtype
    return torch.int8 if name == "int8" else DTYPES[name]


@dataclass(frozen=True)
class Prepared:
    model: Transformer
    tokenizer: Tokenizer
    draft: Transformer | None
    kv_dtype: torch.dtype
    family: Family


def prepare(
    path: str | Path,
    *,
    device: str,
    dtype: str,
    max_seq_len: int,
    quant: str,
    group_size: int,
    self_draft: str,
    kv_cache: str,
) -> Prepared:
    """A Hugging Face folder or a .gguf file (converted once into the user cache dir), see Engine.from_path."""
    if quant not in SCHEMES:
        raise ValueError(f"quant must be one of {SCHEMES}, got {quant!r}")
    kv_dtype = resolve_kv_dtype(kv_cache, resolve_dtype(dtype), device)
    from_gguf = quant != "none" and Path(path).suffix == ".gguf" and (quant == "int8" or group_size == 32)
    if from_gguf:
        # one pass over the file: blocks the scheme holds as they are become layers, the rest is dequantized
        model, folder, replacements = load_gguf_quantized(Path(path), quant, max_seq_len=max_seq_len, dtype=dtype, device=device)
    else:
        (model, folder), replacements = load_model(path, max_seq_len=max_seq_len, dtype=dtype, device=device), {}
    if quant != "none":
        quantize_model(model, quant, group_size=group_size, replacements=replacements)  # type: ignore[arg-type]
    if from_gguf and device == "cpu":
        save_int8_layers(model, Path(folder), quant)  # the next load reads them instead of requantizing
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ValueError(f"{Path(path).name}: no weights for {left[:3]} after loading")
    draft = None
    if self_draft != "none":
        from llm_engine.speculative import make_self_draft

        draft = make_self_draft(model, scheme=self_draft, group_size=group_size)  # type: ignore[arg-type]
    for m in (model, draft):
        if m is not None:
            fuse_projections(m)  # after quantization: GGUF blocks are matched by their unfused names
    return Prepared(model, Tokenizer.from_folder(folder), draft, kv_dtype, family_of_folder(Path(folder)))
