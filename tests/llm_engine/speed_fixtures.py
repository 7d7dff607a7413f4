"""Helpers shared by the speed-feature tests: plain greedy decoding, a cache for a model, the embedded model.

Imported by test_quantize / test_speculative / test_cuda_graphs (this folder is on sys.path under pytest).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
)


def make_cache(model: Transformer, *, slots: int = 1, max_seq_len: int | None = None, int8: bool = False) -> StaticKVCache:
    """A cache of the model's dtype on its device; int8: codes with scales (llm.kv_cache: int8)."""
    c = model.cfg
    return StaticKVCache(
        c.num_layers, slots, c.num_kv_heads, max_seq_len or model.max_seq_len, c.head_dim,
        dtype=torch.int8 if int8 else model.embed_tokens.weight.dtype, device=model.embed_tokens.weight.device,
    )  # fmt: skip


@torch.inference_mode()
def greedy(model: Transformer, prompt: list[int], n: int, *, cache: StaticKVCache | None = None, slot: int = 0) -> tuple[list[int], torch.Tensor]:
    """-> n greedy tokens after the prompt, and the logits [n, V] that chose them."""
    cache = cache or make_cache(model)
    dev = model.embed_tokens.weight.device
    logits = model(torch.tensor([prompt], device=dev), torch.arange(len(prompt), device=dev)[None], cache, [slot])
    out, all_logits = [], []
    pos = len(prompt)
    for _ in range(n):
        all_logits.append(logits[0, -1].float().cpu())
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        logits = model(torch.tensor([[tok]], device=dev), torch.tensor([[pos]], device=dev), cache, [slot], kv_len=pos + 1)
        pos += 1
    return out, torch.stack(all_logits)


def load_smol(max_seq_len: int = 512) -> tuple[Transformer, Path]:
    from llm_engine.loader import load_model
    from parley.locate import find_embedded

    return load_model(find_embedded("llm", "embedded-135m"), max_seq_len=max_seq_len)


def chat_ids(folder: Path, prompts: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    from llm_engine.tokenizer import ChatMessage, Tokenizer

    tok = Tokenizer.from_folder(folder)
    return [tok.apply_chat_template([ChatMessage("user", p)]) for p in prompts]


def tiny_model(
    seed: int, *, layers: int = 2, vocab: int = 64, hidden: int = 64, max_seq_len: int = 128, spread: float = 0.15, tied: bool = False
) -> Transformer:
    """A random Llama built straight from our config (no files): used as target/draft pairs."""
    from llm_engine.config import ModelConfig

    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                      num_heads=4, num_kv_heads=2, head_dim=hidden // 4, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(seed)
    model = Transformer(cfg, max_seq_len)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, spread)
    return model.eval().requires_grad_(False)


@contextmanager
def exact_float(model: Transformer) -> Iterator[None]:
    """The model's quantized layers dequantize and multiply in float32 (no bfloat16 kernels) inside. Each layer's
    float32 weight is dequantized once here, not again at every call (0.6 s a SmolLM2 step otherwise)."""
    layers = [m for m in model.modules() if isinstance(m, (Int4WeightOnlyLinear, Int8WeightOnlyLinear))]
    for m in layers:
        m.use_kernel = False
        weight = m.dequantize(torch.float32)
        m.dequantize = lambda dtype=torch.float32, w=weight: w.to(dtype)  # shadows the method on this instance
    try:
        yield
    finally:
        for m in layers:
            m.use_kernel = True
            del m.dequantize
