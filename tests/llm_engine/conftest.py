"""Shared fixtures for the LLM engine tests: tiny random HF models, the embedded SmolLM2, its reference."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def build_tiny(kind: str, folder: Path) -> Path:
    """A random model saved by transformers; larger init spread so greedy choices are not near-ties."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    if kind == "llama3-rope":
        cfg = LlamaConfig(
            **TINY,
            initializer_range=0.2,
            rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16, "rope_theta": 500000.0,
            },
        )  # fmt: skip
    elif kind == "llama-tied":
        cfg = LlamaConfig(**TINY, initializer_range=0.2, tie_word_embeddings=True)
    elif kind == "qwen2":
        cfg = Qwen2Config(**TINY, initializer_range=0.2)
    elif kind == "qwen3-tied":  # q/k norms, heads wider than hidden / heads, tied head
        cfg = Qwen3Config(**TINY, initializer_range=0.2, head_dim=32, tie_word_embeddings=True)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)  # exercise norm weights and Qwen2 biases
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_builder():
    """build_tiny as a fixture: test modules here are not a package, so they cannot import conftest."""
    return build_tiny


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from parley.locate import find_embedded

    return find_embedded("llm", "embedded-135m")


@pytest.fixture(scope="session")
def smol_engine(smol_path: Path) -> Iterator["object"]:
    from llm_engine.engine import Engine

    engine = Engine.from_path(smol_path, max_seq_len=1024, max_slots=8)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def smol_reference(smol_path: Path):
    """transformers' own model on the same GGUF (slow: dequantizes for ~15 s), the test reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smol_path.parent), gguf_file=smol_path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path: Path):
    """The embedded tokenizer alone (no weights loaded): tiny random models below speak its vocabulary."""
    from llm_engine.gguf_loader import prepare_gguf
    from llm_engine.tokenizer import Tokenizer

    return Tokenizer.from_folder(prepare_gguf(smol_path))


@pytest.fixture(scope="session")
def tiny_chat_model(smol_tokenizer):
    """-> build(seed, max_seq_len): a random Llama over the embedded tokenizer's vocabulary, for engine tests.

    Wide weights (std 0.2) so greedy picks are not near-ties that rounding could flip between batched and solo runs.
    """
    from llm_engine.config import ModelConfig
    from llm_engine.model import Transformer

    def build(seed: int, max_seq_len: int = 1024) -> Transformer:
        cfg = ModelConfig(vocab_size=smol_tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip
        torch.manual_seed(seed)
        model = Transformer(cfg, max_seq_len)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
        return model.eval().requires_grad_(False)

    return build
