"""Picks the next token from logits: greedy, temperature, top-k, top-p, repetition penalty, seeded.

A pure function of (logits, params, generator, history); it knows nothing about models or requests.
"""
from __future__ import annotations

from typing import Sequence

import torch

from llm_engine.request import SamplingParams


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    """logits [V]: seen tokens get positive scores divided and negative ones multiplied (CTRL-style)."""
    if penalty == 1.0 or not history:
        return logits
    idx = torch.tensor(sorted(set(history)), device=logits.device)
    seen = logits[idx]
    logits = logits.clone()
    logits[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] -> logits [V] with tokens outside top-k / the top-p nucleus set to -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the best token always survives.
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, history: Sequence[int] = ()
) -> int:
    """logits [V] float32 -> the chosen token id."""
    logits = apply_repetition_penalty(logits.float(), history, params.repetition_penalty)
    if params.temperature <= 0.0:
        return int(torch.argmax(logits))
    if generator is not None and generator.device != logits.device:
        logits = logits.to(generator.device)  # seeded draws come from a CPU generator: same on any device
    logits = filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
