"""Gemma 3 against transformers on a tiny random folder: (1 + w) norms before and after each sublayer, q/k norms,
GeGLU, embeddings scaled by sqrt(hidden), a local and a global rope base (the global one linearly scaled), a
query scale other than head_dim, local and global layers, a tied head. Prefill and 32 decode steps, a sequence
several windows long, within 1e-4 through the eager forward, the compiled CPU step and the graph-ready step."""
from __future__ import annotations

import pytest
import torch
from every_path import assert_every_path_matches

from llm_engine.config import ModelConfig
from llm_engine.loader import load_model

WINDOW, PROMPT_LEN, STEPS, VOCAB = 6, 11, 32, 512
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}},
        initializer_range=0.2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # Gemma initialises its norms to w = 0 (a scale of 1): make them matter
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
    folder = tmp_path_factory.mktemp("gemma3")
    ref.save_pretrained(folder)
    ours, _ = load_model(folder, max_seq_len=64)
    return ours, ref


def test_config_reads_gemma3(pair) -> None:
    ours, _ = pair
    c = ours.cfg
    assert (c.architecture, c.hidden_act, c.qk_norm, c.tie_word_embeddings) == ("gemma3", "gelu_tanh", True, True)
    assert c.layer_windows == (WINDOW, WINDOW, 0, WINDOW)
    assert (c.rope_theta, c.rope_local_theta, c.rope_scaling.rope_type, c.rope_scaling.factor) == (50_000.0, 1_000.0, "linear", 2.0)
    assert [b.self_attn.local_rope for b in ours.layers] == [True, True, False, True]
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c  # the GGUF cache folder's config reads back the same


def test_refuses_soft_capping_and_the_multimodal_folder() -> None:
    base = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "vocab_size": 8}  # fmt: skip
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        ModelConfig.from_hf_dict({**base, "final_logit_softcapping": 30.0})
    with pytest.raises(ValueError, match="gemma3_text"):
        ModelConfig.from_hf_dict({"model_type": "gemma3", "text_config": base})


def test_prefill_and_decode_match_transformers_on_every_path(pair) -> None:
    ours, ref = pair
    torch.manual_seed(1)
    seq = assert_every_path_matches(ours, ref, torch.randint(0, VOCAB, (1, PROMPT_LEN)), STEPS)
    assert len(seq) > 4 * WINDOW  # the windows slid well past the prompt
