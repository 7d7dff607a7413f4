"""Speculative decoding: a cheap draft proposes k tokens, the target checks them all in one forward.

Greedy output equals the target's own greedy output; with temperature > 0 the standard rejection rule
(accept with min(1, p/q), else resample from norm(max(0, p - q))) keeps the target's distribution.
It knows the two models and their caches, nothing about requests, threads or text.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import nn

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer
from llm_engine.quantize import Scheme, quantize_model
from llm_engine.request import SamplingParams
from llm_engine.sampling import apply_repetition_penalty, filter_top_k_top_p


@dataclass
class SpecStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0


@dataclass
class _SlotDraft:
    missing: list[int] = field(default_factory=list)  # accepted tokens the draft cache has not seen yet


def target_probs(logits: torch.Tensor, params: SamplingParams, history: Sequence[int]) -> torch.Tensor:
    """logits [V] -> the distribution sampling.sample draws from (temperature > 0), float32 [V]."""
    logits = apply_repetition_penalty(logits.float(), history, params.repetition_penalty)
    logits = filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    return torch.softmax(logits, dim=-1)


def greedy_pick(logits: torch.Tensor, params: SamplingParams, history: Sequence[int]) -> int:
    return int(torch.argmax(apply_repetition_penalty(logits.float(), history, params.repetition_penalty)))


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, drafted: int, generator: torch.Generator | None) -> int | None:
    """One rejection-sampling test: None = the drafted token stands, else the replacement token drawn from p - q."""
    ratio = float(p[drafted]) / max(float(q[drafted]), 1e-20)
    if ratio >= 1.0 or float(torch.rand((), generator=generator)) < ratio:
        return None
    residual = (p - q).clamp(min=0.0)
    total = float(residual.sum())
    if total <= 0.0:  # p == q up to rounding: any draw from p is right
        residual, total = p, float(p.sum())
    return int(torch.multinomial(residual / total, 1, generator=generator))


class SpeculativeDecoder:
    """Per request step: `step(slot, last_token, pos, params, generator, history) -> tokens emitted (1 .. k+1)`.

    Contract with the caller: both caches hold the slot's tokens at positions [0, pos); `last_token` sits at
    `pos` and is in neither cache yet. After the step the target cache holds [0, pos + len(out) - 1) and the
    last emitted token is the next step's `last_token`. Positions past that are stale but never read: every
    forward writes its own positions before attending, and kv_len is the accepted length plus the new rows.
    """

    def __init__(
        self,
        target: Transformer,
        draft: Transformer,
        target_cache: StaticKVCache,
        draft_cache: StaticKVCache,
        *,
        k: int = 4,
        adaptive: bool = True,
        k_min: int = 1,
        k_max: int = 8,
    ) -> None:
        self.target, self.draft = target, draft
        self.target_cache, self.draft_cache = target_cache, draft_cache
        self.k, self.adaptive, self.k_min, self.k_max = k, adaptive, k_min, k_max
        self.stats = SpecStats()
        self._slots: dict[int, _SlotDraft] = {}
        self._device = target.embed_tokens.weight.device

    def prefill_draft(self, slot: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        """Run the draft over prompt tokens the caller already put into the target cache at [start_pos, ...)."""
        self._slots[slot] = _SlotDraft()
        if tokens:
            self._draft_forward(slot, list(tokens), start_pos)

    def forget(self, slot: int) -> None:
        self._slots.pop(slot, None)

    def _draft_forward(self, slot: int, tokens: list[int], start: int) -> torch.Tensor:
        """-> draft logits [V] after feeding tokens at positions start.. into the draft cache."""
        t = torch.tensor([tokens], device=self._device)  # [1, T]
        pos = torch.arange(start, start + len(tokens), device=self._device)[None]  # [1, T]
        return self.draft(t, pos, self.draft_cache, [slot], "last", kv_len=start + len(tokens))[0, -1]

    @torch.inference_mode()
    def step(
        self,
        slot: int,
        last_token: int,
        pos: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        history: Sequence[int] = (),
    ) -> list[int]:
        greedy = params.temperature <= 0.0
        k = max(0, min(self.k, self.target_cache.max_seq_len - pos - 1, self.draft_cache.max_seq_len - pos - 1))
        state = self._slots.setdefault(slot, _SlotDraft())
        hist = list(history)

        # 1. Draft k tokens autoregressively (the first call also catches up on tokens it missed).
        drafted: list[int] = []
        draft_dists: list[torch.Tensor] = []  # q_i [V] for sampled mode
        feed, start = state.missing + [last_token], pos - len(state.missing)
        for i in range(k):
            logits = self._draft_forward(slot, feed, start)
            if greedy:
                tok = greedy_pick(logits, params, hist + drafted)
            else:
                q = target_probs(logits, params, hist + drafted)
                tok = int(torch.multinomial(q, 1, generator=generator))
                draft_dists.append(q)
            drafted.append(tok)
            feed, start = [tok], pos + i + 1
        if k > 0:
            state.missing = []

        # 2. The target scores last_token and every draft in one forward: row i predicts position pos + i + 1.
        rows = [last_token] + drafted
        t = torch.tensor([rows], device=self._device)  # [1, k+1]
        positions = torch.arange(pos, pos + len(rows), device=self._device)[None]  # [1, k+1]
        logits = self.target(t, positions, self.target_cache, [slot], "all", kv_len=pos + len(rows))[0]  # [k+1, V]

        # 3. Accept the longest agreeing prefix, then one token from the target (correction or bonus).
        out: list[int] = []
        for i, tok in enumerate(drafted):
            if greedy:
                want = greedy_pick(logits[i], params, hist + out)
                if want != tok:
                    out.append(want)
                    break
            else:
                p = target_probs(logits[i], params, hist + out)
                repl = accept_or_resample(p, draft_dists[i], tok, generator)
                if repl is not None:
                    out.append(repl)
                    break
            out.append(tok)
        else:
            final = logits[len(drafted)]
            if greedy:
                out.append(greedy_pick(final, params, hist + out))
            else:
                out.append(int(torch.multinomial(target_probs(final, params, hist + out), 1, generator=generator)))
        n_acc = len(out) - 1

        # The draft saw last_token and drafts[:k-1]; when all k were accepted, drafts[k-1] is still owed to it.
        if k > 0 and n_acc == k:
            state.missing = [drafted[-1]]
        elif k == 0:
            state.missing.append(last_token)
        self._record(k, n_acc, len(out))
        return out

    def _record(self, k: int, n_acc: int, emitted: int) -> None:
        self.stats.steps += 1
        self.stats.drafted += k
        self.stats.accepted += n_acc
        self.stats.emitted += emitted
        if self.adaptive and k > 0:
            # Grow by one while every draft lands, shrink by one on a miss: cheap and stable.
            self.k = min(self.k_max, self.k + 1) if n_acc == k else max(self.k_min, self.k - 1)


def make_self_draft(
    target: Transformer, *, scheme: Scheme = "int4", group_size: int = 32, layers: Sequence[int] | None = None
) -> Transformer:
    """A quantized copy of the target (optionally only some of its layers) sharing its embedding and norm.

    With only the embedded model installed this is the one draft there is: same tokenizer by construction.
    """
    keep = list(range(target.cfg.num_layers)) if layers is None else list(layers)
    cfg = replace(target.cfg, num_layers=len(keep))
    with torch.device("meta"):
        draft = Transformer(cfg, target.max_seq_len)
    blocks = []
    for new_index, old_index in enumerate(keep):
        block = copy.deepcopy(target.layers[old_index])
        block.self_attn.layer = new_index  # its rows in the draft's own cache
        blocks.append(block)
    draft.layers = nn.ModuleList(blocks)
    draft.embed_tokens, draft.norm, draft.lm_head = target.embed_tokens, target.norm, target.lm_head
    draft.rope_cos, draft.rope_sin = target.rope_cos, target.rope_sin
    draft.rope_cos_local, draft.rope_sin_local = target.rope_cos_local, target.rope_sin_local
    return quantize_model(draft, scheme, group_size=group_size).eval()


def draft_cache_like(draft: Transformer, target_cache: StaticKVCache) -> StaticKVCache:
    c = draft.cfg
    return StaticKVCache(
        c.num_layers, target_cache.num_slots, c.num_kv_heads, target_cache.max_seq_len, c.head_dim,
        dtype=target_cache.k.dtype, device=target_cache.k.device,
    )  # fmt: skip
