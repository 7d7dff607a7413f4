"""The graph-ready decode step computes what the eager model computes; on CPU the wrapper is the eager model."""
from __future__ import annotations

import pytest
import torch
from speed_fixtures import make_cache, tiny_model

from llm_engine.cuda_graphs import GraphedDecoder, static_decode_step
from llm_engine.quantize import quantize_model


def prefill(model, cache, prompts: dict[int, list[int]]) -> None:
    """Each slot gets its own prompt of its own length."""
    with torch.inference_mode():
        for slot, ids in prompts.items():
            model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, [slot])


PROMPTS = {0: [1, 2, 3, 4, 5], 1: [7, 8], 2: [9, 10, 11, 12, 13, 14, 15]}


def eager_rows(model, cache, tokens, positions, slots) -> torch.Tensor:
    """Reference: each row alone through the model's own forward -> [B, V]."""
    with torch.inference_mode():
        rows = [
            model(torch.tensor([[t]]), torch.tensor([[p]]), cache, [s], kv_len=p + 1)[0, -1]
            for t, p, s in zip(tokens, positions, slots)
        ]  # fmt: skip
    return torch.stack(rows)


def test_cpu_fallback_is_the_eager_forward_exactly() -> None:
    model = tiny_model(0, layers=2, max_seq_len=32)
    cache_a, cache_b = make_cache(model, slots=3), make_cache(model, slots=3)
    prefill(model, cache_a, PROMPTS)
    prefill(model, cache_b, PROMPTS)
    dec = GraphedDecoder(model, cache_a)
    assert dec.use_graphs is False
    got = dec.decode([20], [5], [0])
    with torch.inference_mode():
        want = model(torch.tensor([[20]]), torch.tensor([[5]]), cache_b, [0], kv_len=6)[:, 0]
    assert torch.equal(got, want)
    assert torch.equal(cache_a.k, cache_b.k)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_static_step_matches_eager_per_row_with_padding(quant: str) -> None:
    """Three rows at different positions in a bucket of four (padded): same logits and same cache rows."""
    model = quantize_model(tiny_model(1, layers=2, max_seq_len=32), quant)  # type: ignore[arg-type]
    cache_s, cache_e = make_cache(model, slots=3), make_cache(model, slots=3)
    prefill(model, cache_s, PROMPTS)
    prefill(model, cache_e, PROMPTS)
    tokens, positions, slots = [30, 31, 32], [5, 2, 7], [0, 1, 2]
    # The graph-ready step run eagerly: the CPU check of what CUDA captures.
    dec = GraphedDecoder(model, cache_s, buckets=(1, 4), use_graphs=False, static_step=True)
    got = dec.decode(tokens, positions, slots)
    want = eager_rows(model, cache_e, tokens, positions, slots)
    assert got.shape == (3, model.cfg.vocab_size)
    # The quantized heads give bfloat16 logits, rounded after an accumulation whose blocking depends on the
    # row count (4 padded rows here, 1 in the reference): allow two bfloat16 steps there.
    tol = 1e-4 if quant == "none" else 2 * torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for s, p in zip(slots, positions):
        # Layer 0's keys come before any quantized rounding; deeper ones inherit the bfloat16 steps above.
        torch.testing.assert_close(cache_s.k[:, s, :, : p + 1], cache_e.k[:, s, :, : p + 1], rtol=tol, atol=tol)


def test_static_step_ignores_stale_rows_past_the_position() -> None:
    model = tiny_model(2, layers=2, max_seq_len=32)
    cache = make_cache(model, slots=1)
    prefill(model, cache, {0: [1, 2, 3, 4, 5, 6, 7, 8]})
    key_pos = torch.arange(32)
    with torch.inference_mode():
        a = static_decode_step(model, cache, torch.tensor([[9]]), torch.tensor([[3]]), torch.tensor([0]), key_pos)
        cache.k[:, :, :, 4:] = 1e4  # garbage beyond position 3 must not matter
        b = static_decode_step(model, cache, torch.tensor([[9]]), torch.tensor([[3]]), torch.tensor([0]), key_pos)
    assert torch.equal(a, b)


def test_bucket_choice() -> None:
    model = tiny_model(0, layers=1, max_seq_len=16)
    dec = GraphedDecoder(model, make_cache(model), buckets=(1, 2, 4, 8))
    assert [dec.bucket_for(b) for b in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError):
        dec.bucket_for(9)


@pytest.mark.cuda
@pytest.mark.parametrize("quant,kv_int8", [("none", False), ("int8", False), ("int4", False), ("int4", True)])
def test_cuda_graph_replay_equals_eager(quant: str, kv_int8: bool) -> None:
    """kv_int8: keys and values as int8 codes with scales (llm.kv_cache: int8), written and read inside the graph."""
    model = quantize_model(tiny_model(1, layers=2, max_seq_len=32), quant).to("cuda", torch.bfloat16)  # type: ignore[arg-type]
    cache_g, cache_e = make_cache(model, slots=3, int8=kv_int8), make_cache(model, slots=3, int8=kv_int8)
    for cache in (cache_g, cache_e):
        with torch.inference_mode():
            for slot, ids in PROMPTS.items():
                model(torch.tensor([ids], device="cuda"), torch.arange(len(ids), device="cuda")[None], cache, [slot])
    dec = GraphedDecoder(model, cache_g, buckets=(1, 4))
    assert dec.use_graphs
    tokens, positions, slots = [30, 31, 32], [5, 2, 7], [0, 1, 2]
    for step in range(3):  # the second and third calls replay the captured graph
        got = dec.decode(tokens, [p + step for p in positions], slots).float()
        with torch.inference_mode():
            want = torch.stack([
                model(torch.tensor([[t]], device="cuda"), torch.tensor([[p + step]], device="cuda"), cache_e, [s], kv_len=p + step + 1)[0, -1]
                for t, p, s in zip(tokens, positions, slots)
            ]).float()  # fmt: skip
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
