"""The GGUFs people download, in miniature: Llama 3 (rope_freqs), Qwen2 (biases), Qwen3 (q/k norms), each tensor type.

Each tiny random model is written with `gguf`'s own writer (tiny_gguf.py) and read back by our loader; the
reference is transformers on the same GGUF, or on the Hugging Face folder the GGUF was written from where
transformers' GGUF reader cannot be the judge (it ignores Llama 3's `rope_freqs`). Logits within 1e-4 at
prefill and over 32 decode steps through the decode path the engine takes, greedy tokens equal.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_gguf as tg
from llm_engine.batch import DecodeRow, StepDecoder
from llm_engine.fuse import fuse_projections
from llm_engine.gguf_loader import prepare_gguf
from llm_engine.gguf_quant import read_quantized_linears, unpack_q4_k
from llm_engine.kv_cache import StaticKVCache
from llm_engine.loader import load_model
from llm_engine.request import ChatMessage
from llm_engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
STEPS = 32
TOL = 1e-4
TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def models(tmp_path_factory, smol_path):
    """-> make(family, qtype) -> (gguf path, hf folder), each written once per module."""
    smol = prepare_gguf(smol_path)
    root = tmp_path_factory.mktemp("families")
    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    def make(family: str, qtype: str = "F32") -> tuple[Path, Path]:
        if (family, qtype) not in made:
            hf = root / family / "hf"
            if not hf.exists():
                tg.build_hf(family, hf, tg.tokenizer_for(family, smol), tied=family == "qwen3")
            made[family, qtype] = tg.write_gguf(hf, root / family / f"{qtype}.gguf", family, qtype), hf
        return made[family, qtype]

    return make


@pytest.fixture(scope="module", autouse=True)
def _cache_root(tmp_path_factory, monkeypatch_module):
    """Conversions go to a temporary cache, not the user's."""
    root = tmp_path_factory.mktemp("gguf-cache")
    monkeypatch_module.setattr("llm_engine.gguf_loader.default_cache_root", lambda: root)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def reference(gguf: Path, hf: Path, *, from_gguf: bool):
    from transformers import AutoModelForCausalLM

    if from_gguf:
        return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()


@torch.inference_mode()
def assert_matches(gguf: Path, ref) -> None:
    """Prefill logits, then STEPS decode steps through the engine's own step (compiled where it can run)."""
    ours, _ = load_model(gguf, max_seq_len=128)
    fuse_projections(ours)
    c = ours.cfg
    cache = StaticKVCache(c.num_layers, 1, c.num_kv_heads, 128, c.head_dim)
    stepper = StepDecoder(ours, cache, max_slots=1)
    torch.manual_seed(1)
    prompt = torch.randint(0, c.vocab_size, (1, 11))
    logits = ours(prompt, torch.arange(11)[None], cache, [0], "all")
    assert (logits - ref(prompt).logits).abs().max().item() < TOL
    seq, tokens = prompt[0].tolist(), []
    nxt = int(logits[0, -1].argmax())
    for step in range(STEPS):
        tokens.append(nxt)
        seq.append(nxt)
        step_logits = stepper.decode([DecodeRow(0, nxt, len(seq) - 1)])[0]
        ref_step = ref(torch.tensor([seq])).logits[0, -1]  # no cache on the reference side
        assert (step_logits - ref_step).abs().max().item() < TOL, f"step {step} ({stepper.path})"
        nxt = int(step_logits.argmax())
    generated = ref.generate(prompt, max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generated[0, 11:].tolist() == tokens
    assert len(set(tokens)) > 3


@pytest.mark.parametrize("family", tg.FAMILIES)
def test_each_family_matches_transformers(models, family: str) -> None:
    gguf, hf = models(family)
    ours, _ = load_model(gguf, max_seq_len=128)
    if family == "llama3":
        assert ours.cfg.rope_scaling.rope_type == "freq_factors" and max(ours.cfg.rope_scaling.freq_factors) == 8.0
    assert ours.cfg.qkv_bias is (family == "qwen2")
    assert ours.cfg.qk_norm is (family == "qwen3")
    assert (ours.lm_head is None) is (family == "qwen3")  # written tied
    # transformers' GGUF reader drops rope_freqs: Llama 3 is judged by the folder it was written from
    assert_matches(gguf, reference(gguf, hf, from_gguf=family != "llama3"))


@pytest.mark.parametrize("qtype", TYPES)
def test_each_tensor_type_matches_transformers(models, qtype: str) -> None:
    gguf, hf = models("qwen2", qtype)
    assert_matches(gguf, reference(gguf, hf, from_gguf=True))


def test_q5_0_loads_under_int4_as_int8_per_channel(models) -> None:
    """Q5_0 (llama.cpp's Q4_K_M fallback where a row is not a multiple of 256) has no int4 form: under llm.quant int4
    its dequantized floats become int8 per channel (4 bits would lose what the file kept), closer than 4 bits get."""
    from llm_engine.prepare import prepare
    from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear

    gguf, _ = models("qwen2", "Q5_0")
    floats, _ = load_model(gguf, max_seq_len=64)
    model = prepare(gguf, device="cpu", dtype="float32", max_seq_len=64, quant="int4", group_size=32,
                    self_draft="none", kv_cache="float32").model  # fmt: skip
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, Int8WeightOnlyLinear)
    want = floats.layers[0].mlp.down_proj.weight
    err = (down.qweight.float() * down.scales[:, None] - want).abs().max() / want.abs().max()
    four = Int4WeightOnlyLinear.from_float(want, group_size=32, use_kernel=False).dequantize() - want
    assert 0 < err < 0.5 * four.abs().max() / want.abs().max()


def test_a_second_load_reads_the_int8_layers_the_first_made(models, monkeypatch) -> None:
    """The int8 layers a quantized load makes from a file (its wider projections and the head) are kept beside its
    converted config: the next load takes them as they are, requantizes nothing, and gives the same logits."""
    import torch

    from llm_engine import quantize
    from llm_engine.gguf_loader import cache_folder_for
    from llm_engine.loader import int8_cache_name
    from llm_engine.prepare import prepare

    gguf, _ = models("qwen2", "Q5_0")
    kept = cache_folder_for(gguf.resolve(), weights=False) / int8_cache_name("int4")
    kept.unlink(missing_ok=True)
    load = lambda: prepare(gguf, device="cpu", dtype="float32", max_seq_len=64, quant="int4", group_size=32,  # noqa: E731
                           self_draft="none", kv_cache="float32").model  # fmt: skip
    from llm_engine.kv_cache import StaticKVCache

    def logits(model) -> torch.Tensor:
        c = model.cfg
        cache = StaticKVCache(c.num_layers, 1, c.num_kv_heads, 64, c.head_dim, dtype=torch.float32)
        return model(torch.tensor([[5, 9, 12, 3]]), torch.arange(4)[None], cache, [0])

    first = logits(load())
    assert kept.exists()
    calls = []
    real = quantize.Int8WeightOnlyLinear.from_float.__func__
    monkeypatch.setattr(quantize.Int8WeightOnlyLinear, "from_float",
                        classmethod(lambda cls, *a, **k: calls.append(cls) or real(cls, *a, **k)))  # fmt: skip
    second = load()
    assert calls == [] and isinstance(second.lm_head, quantize.Int8Head)
    assert torch.equal(logits(second), first)


def test_wide_types_stay_int8_unless_a_fusion_partner_is_4_bit() -> None:
    """q/k/v and gate/up are fused into one layer of one kind: a Q6_K v beside Q4_K q and k is requantized to 4 bits
    with them; a Q6_K down_proj, or q/k/v all wider than 4 bits (Gemma 3 270M: Q5_0, Q5_0, Q8_0), stays int8."""
    from llm_engine.gguf_quant import kept_wide

    types = {"layers.0.self_attn.q_proj": "Q4_K", "layers.0.self_attn.k_proj": "Q4_K", "layers.0.self_attn.v_proj": "Q6_K",
             "layers.0.mlp.down_proj": "Q6_K", "layers.0.mlp.gate_proj": "Q5_0", "layers.0.mlp.up_proj": "Q5_0",
             "layers.1.self_attn.q_proj": "Q5_0", "layers.1.self_attn.k_proj": "Q5_0", "layers.1.self_attn.v_proj": "Q8_0",
             "embed_tokens": "Q8_0", "lm_head": "Q6_K"}  # fmt: skip
    assert kept_wide(types) == {"layers.0.mlp.down_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
                                "layers.1.self_attn.q_proj", "layers.1.self_attn.k_proj", "layers.1.self_attn.v_proj"}  # fmt: skip


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K"])
def test_4bit_blocks_load_into_int4_layers_exactly(models, qtype: str) -> None:
    """No float round trip: our int4 layers hold exactly the weights the file's blocks decode to (Llama's
    permuted Q/K rows included: codes and group scales follow the rows)."""
    gguf, _ = models("llama3", qtype)
    floats, _ = load_model(gguf, max_seq_len=128)
    layers = read_quantized_linears(gguf, "int4", use_kernel=False)
    assert len(layers) == 7 * floats.cfg.num_layers + 1  # every projection, and the head the file stores in 4 bits
    state = floats.state_dict()
    for path, layer in layers.items():
        assert torch.equal(layer.dequantize(), state[f"{path}.weight"]), path


def test_q4_k_unpacks_to_what_gguf_dequantizes() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = tg.random_k_blocks("Q4_K", 6, 512, np.random.default_rng(3))
    codes, scales, mins = unpack_q4_k(raw, 6, 512)
    ours = (codes.reshape(6, 16, 32) * scales[..., None] + mins[..., None]).reshape(6, 512)
    assert np.array_equal(ours, dequantize(raw, GGMLQuantizationType.Q4_K).reshape(6, 512))
    assert codes.max() == 15 and mins.min() < 0


def test_an_unsupported_tensor_type_or_architecture_is_one_line(models, tmp_path: Path) -> None:
    gguf, hf = models("qwen2", "F32")
    q5 = tg.write_gguf(hf, tmp_path / "q5_1.gguf", "qwen2", "Q5_1")
    with pytest.raises(ValueError, match=r"q5_1.gguf: tensor .* is Q5_1; Parley reads F32, .*Q5_0, .*Q6_K"):
        prepare_gguf(q5)
    import gguf as gg

    w = gg.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match=r"gemma.gguf: unsupported architecture 'gemma': Parley runs llama, mistral, qwen2, qwen3"):
        prepare_gguf(tmp_path / "gemma.gguf")


CHAT = [ChatMessage("system", "You are brief."), ChatMessage("user", "Hi there."),
        ChatMessage("assistant", "Hello!"), ChatMessage("user", "What is two plus two?")]  # fmt: skip


@pytest.mark.parametrize("family", tg.FAMILIES)
def test_chat_template_renders_as_the_model_ships_it(models, family: str) -> None:
    from transformers import AutoTokenizer

    gguf, hf = models(family)
    ours = Tokenizer.from_folder(prepare_gguf(gguf))
    shipped = AutoTokenizer.from_pretrained(str(hf))  # the tokenizer the GGUF was written from
    dicts = [{"role": m.role, "content": m.content} for m in CHAT]
    expected = shipped.apply_chat_template(dicts, add_generation_prompt=True, tokenize=False)
    assert ours.render_chat(CHAT) == expected
    assert ours.apply_chat_template(CHAT) == shipped(expected, add_special_tokens=False)["input_ids"]
    end = "<|eot_id|>" if family == "llama3" else "<|im_end|>"
    assert expected.count(end) == 4
    assert ours.hf.convert_tokens_to_ids(end) in ours.stop_ids


def test_an_engine_on_a_q4_k_qwen3_answers_like_transformers(models) -> None:
    """The whole path: the chat template, the engine's own prefill and decode steps, and the model's end-of-turn
    token as a stop, against transformers on the same file. Then the same file with its Q4_K blocks taken as
    int4 layers (exact weights, tested above; the torch int4 prefill kernel rounds activations, so that run
    is checked for what it runs, not token for token)."""
    from llm_engine.engine import Engine
    from llm_engine.request import GenerateRequest, SamplingParams

    gguf, hf = models("qwen3", "Q4_K")
    ref = reference(gguf, hf, from_gguf=True)
    answers, paths = {}, {}
    for quant in ("none", "int4"):
        engine = Engine.from_path(gguf, max_seq_len=256, max_slots=2, quant=quant, kv_cache="float32")
        engine.start()
        try:
            ids = engine.tokenizer.apply_chat_template(CHAT)
            answers[quant], _, _ = engine.submit(GenerateRequest("q", tuple(CHAT), SamplingParams(max_new_tokens=STEPS))).collect()
            paths[quant] = engine.decode_path
        finally:
            engine.stop()
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False,
                           eos_token_id=sorted(engine.tokenizer.stop_ids), pad_token_id=0)  # fmt: skip
    expected = [t for t in out[0, len(ids) :].tolist() if t not in engine.tokenizer.stop_ids]
    assert answers["none"] == expected
    assert len(expected) >= 5
    assert len(answers["int4"]) >= 5
    assert "int4" in paths["int4"] and "int4" not in paths["none"], paths


@torch.inference_mode()
def test_the_compiled_step_reads_q4_k_factors_and_gets_what_float32_scales_give(models) -> None:
    """Q4_K layers keep the file's compact factors (19 bytes per 32 weights where float32 pairs take 24): the
    compiled step's logits are as close to reading the float32 (scale, minimum) pairs they expand to as the int8-input
    rounding allows (the Q4_K kernel rounds the input per super-block, the pairs' per 32 inputs)."""
    from llm_engine.native.decoder import NativeDecoder, compiled_kernels, kernels_used
    from llm_engine.prepare import prepare
    from llm_engine.quantize import Int4WeightOnlyLinear

    gguf, _ = models("llama3", "Q4_K")
    load = lambda: prepare(gguf, device="cpu", dtype="float32", max_seq_len=64, quant="int4", group_size=32,  # noqa: E731
                           self_draft="none", kv_cache="float32").model  # fmt: skip
    first, model = load(), load()  # the second reads the dequantized rest (embedding, norms) from the cache
    assert first.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), model.state_dict().values()))
    int4 = [m for m in model.modules() if isinstance(m, Int4WeightOnlyLinear)]
    assert int4 and all(m.kblocks is not None for m in int4)  # every projection, fused, and the head
    # read in one pass of the file: no float32 copy of the 4-bit projections was written for this load
    meta = prepare_gguf(gguf, weights=False)
    assert not (meta / "model.safetensors").exists() and (meta / "rest-int4.safetensors").exists()
    kernels = compiled_kernels()  # VNNI and AVX2 both read the factors (int4_vnni.h, int8dot_avx2.h)
    if not kernels:
        pytest.skip("no int8-input kernel here: the float kernel reads the float32 pairs either way")
    c = model.cfg
    caches = {(kernel, n): StaticKVCache(c.num_layers, 1, c.num_kv_heads, 64, c.head_dim) for kernel in kernels for n in (0, 1)}
    tokens = [5, 900, 77, 1000, 12]
    with_factors = {}
    for kernel in kernels:
        assert "Q4_K factors" in kernels_used(model, kernel)
        first = NativeDecoder(model, caches[kernel, 0], int8_dot=kernel if kernel == "avx2" else True)
        with_factors[kernel] = [first.decode([t], [i], [0]) for i, t in enumerate(tokens)]
    kept = [m.kblocks for m in int4]
    for m in int4:
        m.kblocks = None
    try:
        for kernel in kernels:
            assert "float32 scales" in kernels_used(model, kernel)
            second = NativeDecoder(model, caches[kernel, 1], int8_dot=kernel if kernel == "avx2" else True)
            for i, t in enumerate(tokens):
                got, want = second.decode([t], [i], [0]), with_factors[kernel][i]
                # Q4_K blocks take one input scale per super-block (int8dot_avx2.h, on VNNI machines too), the pairs
                # one per 32 inputs: as close as the input's rounding allows
                assert float((got - want).abs().max()) < 2e-3 * float(want.abs().max()), (kernel, i)
    finally:
        for m, kb in zip(int4, kept):
            m.kblocks = kb
