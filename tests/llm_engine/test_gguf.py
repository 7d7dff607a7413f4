"""The embedded SmolLM2 GGUF: conversion cache, Q/K un-permutation, greedy output equal to transformers'."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_engine.gguf_loader import hf_name, prepare_gguf, unpermute_qk
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams, TokenEvent

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
]
MAX_NEW = 24


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF q/k rows (written from its description, for the round trip)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.random.default_rng(0).normal(size=(3 * 64, 576)).astype(np.float32)
    assert np.array_equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)


def test_tensor_names_map_to_hf():
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        hf_name("blk.0.mystery.weight")


def test_conversion_is_cached_and_reused(smol_path):
    folder = prepare_gguf(smol_path)
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert prepare_gguf(smol_path) == folder
    assert weights.stat().st_mtime_ns == before  # not converted again
    assert {"config.json", "tokenizer.json", "done"} <= {p.name for p in folder.iterdir()}


def test_weights_equal_transformers_dequantized_weights(smol_engine, smol_reference):
    ours = smol_engine.model.state_dict()
    ref = {k.removeprefix("model."): v for k, v in smol_reference.state_dict().items()}
    assert torch.equal(ours["embed_tokens.weight"], ref["embed_tokens.weight"])
    for layer in (0, 5):  # the engine fuses q/k/v (and gate/up) into one matrix: its rows in order
        attn, mlp = f"layers.{layer}.self_attn", f"layers.{layer}.mlp"
        qkv = torch.cat([ref[f"{attn}.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(ours[f"{attn}.qkv_proj.weight"], qkv), layer
        gate_up = torch.cat([ref[f"{mlp}.gate_proj.weight"], ref[f"{mlp}.up_proj.weight"]])
        assert torch.equal(ours[f"{mlp}.gate_up_proj.weight"], gate_up), layer


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_transformers_generate(smol_engine, smol_reference, prompt):
    msgs = (ChatMessage("user", prompt),)
    ids = smol_engine.tokenizer.apply_chat_template(msgs)
    stream = smol_engine.submit(GenerateRequest(f"ref-{prompt}", msgs, SamplingParams(max_new_tokens=MAX_NEW)))
    ours, _, finish = stream.collect()
    smol_engine.release(f"ref-{prompt}")
    with torch.inference_mode():
        out = smol_reference.generate(
            torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=sorted(smol_engine.tokenizer.stop_ids)
        )
    ref = out[0, len(ids) :].tolist()
    if ref and ref[-1] in smol_engine.tokenizer.stop_ids:
        ref = ref[:-1]  # our stream ends with a FinishEvent instead of the stop token
        assert finish.reason == "stop"
    assert ours == ref
    assert len(ours) >= 5


def test_chat_answers_the_capital_of_france(smol_engine):
    msgs = (ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", "What is the capital of France?"))
    events = list(smol_engine.submit(GenerateRequest("paris", msgs, SamplingParams(max_new_tokens=32))))
    smol_engine.release("paris")
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert "Paris" in text
    assert events[-1].reason == "stop"
