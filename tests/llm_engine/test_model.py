"""Our model against transformers' on tiny random Llama / Qwen2 / Qwen3 models: logits within 1e-4, same greedy tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.loader import load_model
from llm_engine.model import rope_inv_freq
from llm_engine.config import RopeScaling

DECODE_STEPS = 32


@pytest.fixture(scope="module", params=["llama3-rope", "llama-tied", "qwen2", "qwen3-tied"])
def tiny_pair(request, tmp_path_factory, tiny_builder):
    from transformers import AutoModelForCausalLM

    folder = tiny_builder(request.param, tmp_path_factory.mktemp(request.param))
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours, _ = load_model(folder, max_seq_len=128)
    return request.param, ours, ref


def new_cache(model, slots: int = 1, max_seq: int = 128) -> StaticKVCache:
    c = model.cfg
    return StaticKVCache(c.num_layers, slots, c.num_kv_heads, max_seq, c.head_dim)


def test_config_read_from_hf(tiny_pair):
    kind, ours, _ = tiny_pair
    assert ours.cfg.qkv_bias is (kind == "qwen2")
    assert ours.cfg.tie_word_embeddings is kind.endswith("-tied")
    assert (ours.lm_head is None) is kind.endswith("-tied")
    assert ours.cfg.qk_norm is (kind == "qwen3-tied")
    assert ours.cfg.rope_scaling.rope_type == ("llama3" if kind == "llama3-rope" else "default")


@torch.inference_mode()
def test_prefill_and_every_decode_step_match_transformers(tiny_pair):
    _, ours, ref = tiny_pair
    torch.manual_seed(1)
    prompt = torch.randint(0, 512, (1, 11))
    cache = new_cache(ours)
    logits = ours(prompt, torch.arange(11)[None], cache, [0], "all")  # [1, 11, V]
    ref_logits = ref(prompt).logits
    assert (logits - ref_logits).abs().max().item() < 1e-4

    seq = prompt[0].tolist()
    ours_tokens = []
    nxt = int(logits[0, -1].argmax())
    for step in range(DECODE_STEPS):
        ours_tokens.append(nxt)
        pos = len(seq)
        seq.append(nxt)
        step_logits = ours(torch.tensor([[nxt]]), torch.tensor([[pos]]), cache, [0])[0, -1]
        # Reference: a full forward with no cache, so any cache bug on our side would show.
        ref_step = ref(torch.tensor([seq])).logits[0, -1]
        assert (step_logits - ref_step).abs().max().item() < 1e-4, f"step {step}"
        nxt = int(step_logits.argmax())

    generated = ref.generate(prompt, max_new_tokens=DECODE_STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generated[0, 11:].tolist() == ours_tokens
    assert len(set(ours_tokens)) > 3  # a real continuation, not one token repeated


@torch.inference_mode()
def test_batched_slots_match_single_slot_runs(tiny_pair):
    """Two sessions in one forward ([B=2], different positions and slots) give each one's own logits."""
    _, ours, _ = tiny_pair
    torch.manual_seed(2)
    a, b = torch.randint(0, 512, (1, 9)), torch.randint(0, 512, (1, 5))
    single = new_cache(ours, slots=3)
    ours(a, torch.arange(9)[None], single, [2], "all")
    ours(b, torch.arange(5)[None], single, [0], "all")
    want_a = ours(torch.tensor([[7]]), torch.tensor([[9]]), single, [2])[0, -1]
    want_b = ours(torch.tensor([[8]]), torch.tensor([[5]]), single, [0])[0, -1]

    batched = new_cache(ours, slots=3)
    ours(a, torch.arange(9)[None], batched, [2], "all")
    ours(b, torch.arange(5)[None], batched, [0], "all")
    got = ours(torch.tensor([[7], [8]]), torch.tensor([[9], [5]]), batched, [2, 0])  # [2, 1, V]
    assert (got[0, -1] - want_a).abs().max().item() < 1e-5
    assert (got[1, -1] - want_b).abs().max().item() < 1e-5


def test_llama3_rope_scaling_leaves_high_freqs_and_slows_low_freqs():
    plain = rope_inv_freq(64, 500000.0, RopeScaling())
    scaled = rope_inv_freq(64, 500000.0, RopeScaling("llama3", 8.0, 1.0, 4.0, 8192))
    assert torch.equal(scaled[:4], plain[:4])  # short wavelengths untouched
    assert torch.allclose(scaled[-4:], plain[-4:] / 8.0)  # long wavelengths divided by the factor
    assert ((scaled <= plain) & (scaled >= plain / 8.0)).all()


def test_bfloat16_model_tracks_float32(tiny_pair, tmp_path: Path):
    _, ours, _ = tiny_pair
    # Reload the same weights in bfloat16 through a state-dict round trip.
    from llm_engine.loader import build_model

    state = {k: v.clone() for k, v in ours.state_dict().items()}
    bf16 = build_model(ours.cfg, state, max_seq_len=128, dtype=torch.bfloat16, device="cpu")
    prompt = torch.randint(0, 512, (1, 8))
    with torch.inference_mode():
        l32 = ours(prompt, torch.arange(8)[None], new_cache(ours), [0])
        c = ours.cfg
        cache16 = StaticKVCache(c.num_layers, 1, c.num_kv_heads, 128, c.head_dim, dtype=torch.bfloat16)
        l16 = bf16(prompt, torch.arange(8)[None], cache16, [0])
    assert l16.dtype == torch.float32
    assert torch.corrcoef(torch.stack([l32.flatten(), l16.flatten()]))[0, 1] > 0.99


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_half_precision_tracks_cpu_float32(tiny_pair, dtype):
    from llm_engine.loader import build_model, resolve_dtype

    _, ours, _ = tiny_pair
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    gpu = build_model(ours.cfg, state, max_seq_len=128, dtype=resolve_dtype(dtype), device="cuda")
    c = ours.cfg
    cache = StaticKVCache(c.num_layers, 1, c.num_kv_heads, 128, c.head_dim, dtype=resolve_dtype(dtype), device="cuda")
    prompt = torch.randint(0, 512, (1, 8))
    with torch.inference_mode():
        want = ours(prompt, torch.arange(8)[None], new_cache(ours), [0])
        got = gpu(prompt.cuda(), torch.arange(8, device="cuda")[None], cache, [0]).cpu()
    assert torch.corrcoef(torch.stack([want.flatten(), got.flatten()]))[0, 1] > 0.99
