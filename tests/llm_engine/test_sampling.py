"""Sampler: greedy, temperature, top-k, top-p, repetition penalty, seeding."""
from __future__ import annotations

import torch

from llm_engine.request import SamplingParams
from llm_engine.sampling import apply_repetition_penalty, filter_top_k_top_p, make_generator, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0, 0.0])  # argmax 4, then 0, 1, 2, 5, 3


def draws(params: SamplingParams, n: int = 300, history=()) -> list[int]:
    g = make_generator(params.seed)
    return [sample(LOGITS, params, g, history) for _ in range(n)]


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(), None) == 4


def test_same_seed_same_draws_other_seed_differs():
    p = SamplingParams(temperature=1.5, seed=7)
    assert draws(p) == draws(p)
    assert draws(p) != draws(SamplingParams(temperature=1.5, seed=8))


def test_top_k_limits_support():
    assert set(draws(SamplingParams(temperature=2.0, top_k=2, seed=0))) == {4, 0}
    assert set(draws(SamplingParams(temperature=5.0, top_k=1, seed=0))) == {4}


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.softmax(LOGITS, -1)  # p(4)=0.60, p(0)=0.22, ...
    assert probs[4] < 0.7 < probs[4] + probs[0]
    kept = filter_top_k_top_p(LOGITS, 0, 0.7)
    assert torch.isfinite(kept).nonzero().flatten().tolist() == [0, 4]
    assert torch.isfinite(filter_top_k_top_p(LOGITS, 0, 0.01)).sum() == 1  # the best token always survives
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.7, seed=1))) == {0, 4}


def test_temperature_sharpens_and_flattens():
    cold = draws(SamplingParams(temperature=0.1, seed=3))
    hot = draws(SamplingParams(temperature=10.0, seed=3))
    assert cold.count(4) > 290
    assert len(set(hot)) == 6


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    out = apply_repetition_penalty(LOGITS, [4, 3, 4], 2.0)
    assert out[4].item() == 1.5 and out[3].item() == -2.0
    assert torch.equal(out[[0, 1, 2, 5]], LOGITS[[0, 1, 2, 5]])
    # Strong enough, it moves greedy off the repeated token.
    assert sample(LOGITS, SamplingParams(repetition_penalty=2.0), None, [4]) == 0
