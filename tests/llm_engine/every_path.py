"""One check shared by the sliding-window and Gemma 3 tests: our prefill and decode steps against transformers'
uncached forward, through the eager forward, the compiled CPU step and the graph-ready (CUDA) step."""
from __future__ import annotations

import copy

import torch

from llm_engine.cuda_graphs import GraphedDecoder
from llm_engine.fuse import fuse_projections
from llm_engine.kv_cache import StaticKVCache


def new_cache(model, slots: int = 1, max_seq: int = 64) -> StaticKVCache:
    c = model.cfg
    return StaticKVCache(c.num_layers, slots, c.num_kv_heads, max_seq, c.head_dim)


@torch.inference_mode()
def assert_every_path_matches(ours, ref, prompt: torch.Tensor, steps: int, tol: float = 1e-4) -> list[int]:
    """prompt [1, T]: prefill logits at every position, then `steps` greedy decode steps, each path within tol of
    transformers' logits (recomputed over the whole sequence: a cache bug on ours would show). -> the sequence."""
    from llm_engine.native.decoder import NativeDecoder

    n = prompt.shape[1]
    fused = fuse_projections(copy.deepcopy(ours))
    eager, compiled, graphed = new_cache(ours), new_cache(fused), new_cache(ours, slots=2)
    logits = ours(prompt, torch.arange(n)[None], eager, [0], "all")
    assert (logits - ref(prompt).logits).abs().max().item() < tol  # the prompt's masks (windows too)
    fused(prompt, torch.arange(n)[None], compiled, [0])
    ours(prompt, torch.arange(n)[None], graphed, [1])
    native = NativeDecoder(fused, compiled)
    static = GraphedDecoder(ours, graphed, buckets=(2,), use_graphs=False, static_step=True)  # padded to 2 rows
    seq = prompt[0].tolist()
    token = int(logits[0, -1].argmax())
    for step in range(steps):
        pos = len(seq)
        seq.append(token)
        want = ref(torch.tensor([seq])).logits[0, -1]
        got = {
            "eager": ours(torch.tensor([[token]]), torch.tensor([[pos]]), eager, [0])[0, -1],
            "compiled": native.decode([token], [pos], [0])[0],
            "graph-ready": static.decode([token], [pos], [1])[0],
        }
        for path, row in got.items():
            assert (row - want).abs().max().item() < tol, f"{path}, step {step}"
        token = int(want.argmax())
    return seq
