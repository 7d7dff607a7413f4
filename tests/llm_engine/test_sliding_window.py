"""Sliding-window attention against transformers on tiny random models, sequences longer than the window:
Mistral (one window on every layer) and a Qwen2 with per-layer types (two local layers to one global, the
shape of Gemma 3's five to one). Prefill and 32 decode steps within 1e-4, through the eager forward, the
compiled CPU step and the graph-ready (CUDA) step."""
from __future__ import annotations

import pytest
import torch
from every_path import assert_every_path_matches, new_cache

from llm_engine.loader import load_model

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            initializer_range=0.2)  # fmt: skip
PROMPT_LEN, STEPS = 11, 32


def build(kind: str, folder):
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

    if kind == "mistral":
        cfg = MistralConfig(**TINY, num_hidden_layers=2, sliding_window=5)
    else:  # local, local, global
        cfg = Qwen2Config(**TINY, num_hidden_layers=3, use_sliding_window=True, sliding_window=6,
                          layer_types=["sliding_attention", "sliding_attention", "full_attention"])  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(folder)
    return model.eval()


@pytest.fixture(scope="module", params=["mistral", "qwen2-local-global"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    ref = build(request.param, folder)
    ours, _ = load_model(folder, max_seq_len=64)
    return request.param, ours, ref


def test_windows_are_read_per_layer(pair) -> None:
    kind, ours, _ = pair
    want = (5, 5) if kind == "mistral" else (6, 6, 0)
    assert ours.cfg.layer_windows == want
    assert [b.self_attn.window for b in ours.layers] == list(want)
    from llm_engine.config import ModelConfig

    assert ModelConfig.from_hf_dict(ours.cfg.to_hf_dict()) == ours.cfg  # the GGUF cache folder keeps them


def test_prefill_and_decode_match_transformers_on_every_path(pair) -> None:
    _, ours, ref = pair
    torch.manual_seed(1)
    seq = assert_every_path_matches(ours, ref, torch.randint(0, 512, (1, PROMPT_LEN)), STEPS)
    assert len(seq) > 4 * max(ours.cfg.layer_windows)  # the windows slid well past the prompt


@torch.inference_mode()
def test_batched_rows_each_see_their_own_window(pair) -> None:
    """Two rows at different positions in one forward (the mask path, not the single-row slice)."""
    _, ours, _ = pair
    torch.manual_seed(2)
    a, b = torch.randint(0, 512, (1, 13)), torch.randint(0, 512, (1, 4))
    single, batched = new_cache(ours, slots=2), new_cache(ours, slots=2)
    for cache in (single, batched):
        ours(a, torch.arange(13)[None], cache, [0])
        ours(b, torch.arange(4)[None], cache, [1])
    want = [ours(torch.tensor([[7]]), torch.tensor([[13]]), single, [0])[0, -1],
            ours(torch.tensor([[8]]), torch.tensor([[4]]), single, [1])[0, -1]]  # fmt: skip
    got = ours(torch.tensor([[7], [8]]), torch.tensor([[13], [4]]), batched, [0, 1])[:, -1]
    for i in range(2):
        assert (got[i] - want[i]).abs().max().item() < 1e-5
