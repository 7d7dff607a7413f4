"""Speculative decoding keeps the target's output: identical greedy tokens, the same sampling distribution."""
from __future__ import annotations

import pytest
import torch
from speed_fixtures import chat_ids, greedy, load_smol, make_cache, tiny_model

from llm_engine.request import SamplingParams
from llm_engine.speculative import SpeculativeDecoder, accept_or_resample, draft_cache_like, make_self_draft, target_probs

# Chi-square critical values at p = 0.001 (a correct sampler fails one run in a thousand).
CHI2_CRIT_001 = {5: 20.515, 7: 24.322, 15: 37.697}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def speculate(dec: SpeculativeDecoder, target, prompt: list[int], n: int, params: SamplingParams, gen=None) -> list[int]:
    """Prefill both models, then speculative steps until n tokens: what the engine will do per request."""
    dev = target.embed_tokens.weight.device
    with torch.inference_mode():
        logits = target(torch.tensor([prompt], device=dev), torch.arange(len(prompt), device=dev)[None], dec.target_cache, [0])
    dec.prefill_draft(0, prompt)
    out = [int(logits[0, -1].argmax())]
    pos = len(prompt)
    while len(out) < n:
        new = dec.step(0, out[-1], pos, params, gen, history=out)
        pos += len(new)
        out.extend(new)
    return out[:n]


@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (4, True)])
def test_greedy_equals_target_greedy_with_a_separate_random_draft(k: int, adaptive: bool) -> None:
    target = tiny_model(1, layers=2, max_seq_len=96)
    draft = tiny_model(2, layers=1, max_seq_len=96)
    for prompt in ([1, 2, 3], [5, 9, 11, 40, 3, 7], [63]):
        ref, _ = greedy(target, prompt, 40)
        dec = SpeculativeDecoder(target, draft, make_cache(target), make_cache(draft), k=k, adaptive=adaptive)
        assert speculate(dec, target, prompt, 40, SamplingParams()) == ref
        # each step emits what it accepted plus one token of the target's own, and the steps made the 39 tokens
        # after the prefill's (the last step may overshoot by its drafts)
        stats = dec.stats
        assert stats.drafted > 0 and stats.emitted == stats.accepted + stats.steps, stats
        assert 39 <= stats.emitted <= 39 + max(k, dec.k_max), stats


def test_self_draft_of_a_tiny_model_is_greedy_exact_and_mostly_accepted() -> None:
    target = tiny_model(3, layers=2, max_seq_len=96)
    draft = make_self_draft(target, scheme="int8")
    ref, _ = greedy(target, [4, 8, 15, 16], 50)
    dec = SpeculativeDecoder(target, draft, make_cache(target), draft_cache_like(draft, make_cache(target)), k=4)
    assert speculate(dec, target, [4, 8, 15, 16], 50, SamplingParams()) == ref
    # An int8 copy of the same weights almost always agrees with the target.
    assert dec.stats.acceptance_rate > 0.8
    assert dec.stats.tokens_per_step > 2.0


def test_speculation_stops_at_the_end_of_the_cache() -> None:
    target = tiny_model(1, layers=2, max_seq_len=24)
    draft = tiny_model(2, layers=1, max_seq_len=24)
    ref, _ = greedy(target, [1, 2, 3], 20)  # fills the cache up to position 22
    dec = SpeculativeDecoder(target, draft, make_cache(target), make_cache(draft), k=6, adaptive=False)
    assert speculate(dec, target, [1, 2, 3], 20, SamplingParams()) == ref


def test_rejection_rule_reproduces_the_target_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.10, 0.20])
    q = torch.tensor([0.30, 0.10, 0.25, 0.05, 0.25, 0.05])  # a bad draft: most mass where p has little
    n = 20000
    draws = torch.multinomial(q, n, replacement=True, generator=gen)
    counts = torch.zeros(6)
    accepted = 0
    for d in draws.tolist():
        repl = accept_or_resample(p, q, d, gen)
        accepted += repl is None
        counts[d if repl is None else repl] += 1
    assert chi_square(counts, p) < CHI2_CRIT_001[5]
    # The expected acceptance rate is sum(min(p, q)) = 0.40 here.
    assert abs(accepted / n - float(torch.minimum(p, q).sum())) < 0.02


def test_sampled_speculative_step_keeps_the_target_distribution_end_to_end() -> None:
    """First token of a step, drawn 800 times from the same state: chi-square against the target's p."""
    target = tiny_model(5, layers=2, vocab=8, hidden=32, max_seq_len=32, spread=0.4)
    draft = tiny_model(6, layers=1, vocab=8, hidden=32, max_seq_len=32, spread=0.4)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 2, 3, 4]
    tcache, dcache = make_cache(target), make_cache(draft)
    with torch.inference_mode():
        target(torch.tensor([prompt]), torch.arange(4)[None], tcache, [0])
        p = target_probs(target(torch.tensor([[5]]), torch.tensor([[4]]), tcache, [0], kv_len=5)[0, -1], params, [])
    dec = SpeculativeDecoder(target, draft, tcache, dcache, k=2, adaptive=False)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(8)
    n = 800
    for _ in range(n):
        dec.prefill_draft(0, prompt)  # resets what the draft owes; the caches' stale rows get overwritten
        counts[dec.step(0, 5, 4, params, gen)[0]] += 1
    assert chi_square(counts, p) < CHI2_CRIT_001[7]
    assert 0.0 < dec.stats.acceptance_rate < 1.0  # a different random draft: some drafts are rejected


@pytest.mark.slow
def test_embedded_model_with_int4_self_draft_is_greedy_exact() -> None:
    model, folder = load_smol(max_seq_len=256)
    prompt = chat_ids(folder)[0]
    ref, _ = greedy(model, prompt, 16)
    draft = make_self_draft(model, scheme="int4")
    cache = make_cache(model)
    dec = SpeculativeDecoder(model, draft, cache, draft_cache_like(draft, cache), k=4)
    assert speculate(dec, model, prompt, 16, SamplingParams()) == ref
    # The int4 draft of the same weights agrees with the fp32 target most of the time (measured ~0.9).
    assert dec.stats.acceptance_rate > 0.6, dec.stats
