"""Fused q/k/v and gate/up projections: exactly the unfused layers, for float and quantized weights."""
from __future__ import annotations

import copy

import pytest
import torch
from speed_fixtures import greedy, make_cache, tiny_model
from torch import nn

from llm_engine.fuse import concat_rows, fuse_projections
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear, quantize_model


def _layers(kind: str, bias: bool) -> list[nn.Module]:
    torch.manual_seed(0)
    out = []
    for n in (64, 32, 32):
        lin = nn.Linear(96, n, bias=bias)
        if kind == "int8":
            lin = Int8WeightOnlyLinear.from_float(lin.weight, lin.bias)
        elif kind == "int4":
            lin = Int4WeightOnlyLinear.from_float(lin.weight, lin.bias, group_size=32)
        out.append(lin)
    return out


@pytest.mark.parametrize("kind", ["float", "int8", "int4"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5])
def test_concatenated_layer_equals_its_parts(kind: str, bias: bool, rows: int) -> None:
    layers = _layers(kind, bias)
    fused = concat_rows(layers)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        want = torch.cat([layer(x) for layer in layers], dim=-1)
        got = fused(x)
    assert got.shape == (rows, 128)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_layers_of_different_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="one kind"):
        concat_rows([nn.Linear(32, 8), Int8WeightOnlyLinear.from_float(torch.randn(8, 32))])


@pytest.mark.parametrize("scheme", ["none", "int8", "int4"])
def test_fused_model_decodes_the_same_tokens_and_logits(scheme: str) -> None:
    model = quantize_model(tiny_model(3, layers=2, vocab=64, hidden=64), scheme, group_size=32)  # type: ignore[arg-type]
    fused = fuse_projections(copy.deepcopy(model))
    assert all(b.self_attn.qkv_proj is not None and not hasattr(b.self_attn, "q_proj") for b in fused.layers)
    assert all(b.mlp.gate_up_proj is not None and not hasattr(b.mlp, "up_proj") for b in fused.layers)
    assert fuse_projections(fused) is fused  # a second call changes nothing
    prompt = [1, 5, 9, 2, 7]
    want_tokens, want_logits = greedy(model, prompt, 12)
    got_tokens, got_logits = greedy(fused, prompt, 12)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)


def test_batched_decode_of_a_fused_model_matches_rows_alone() -> None:
    """The grouped-query shortcut (one query sees every key) only applies to a lone row: batches keep the mask."""
    model = fuse_projections(tiny_model(4, layers=2, vocab=64, hidden=64))
    cache = make_cache(model, slots=2)
    prompts = ([3, 4, 5], [9, 8, 7, 6, 5])
    singles = [greedy(model, p, 1)[1][0] for p in prompts]
    with torch.inference_mode():
        for slot, p in enumerate(prompts):
            model(torch.tensor([p]), torch.arange(len(p))[None], cache, [slot])
        first = [int(s.argmax()) for s in singles]
        logits = model(torch.tensor([[first[0]], [first[1]]]), torch.tensor([[3], [5]]), cache, [0, 1], kv_len=6)
    alone = [greedy(model, p, 2)[1][1] for p in prompts]
    for row in range(2):
        torch.testing.assert_close(logits[row, -1], alone[row], rtol=0, atol=1e-5)
