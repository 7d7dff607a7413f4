"""The compiled CPU decode step (llm_engine/native) against the model's own float32 math.

The reference is the PyTorch forward with every quantized layer on dequantize+matmul (use_kernel=False),
i.e. exact float32 arithmetic on the same weights: the compiled step must match it to rounding (float
kernels) or to its int8-input rounding (the int4 path on VNNI or its portable loops), rows batched or alone, and write the same
keys and values into the cache.
"""
from __future__ import annotations

import pytest
import torch
from speed_fixtures import exact_float

from llm_engine.config import ModelConfig
from llm_engine.fuse import fuse_projections
from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer
from llm_engine.native import build
from llm_engine.native.decoder import NativeDecoder, kernels_used, native_decoder, unsupported
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear, quantize_model

SEQ = 64


def has_int8_dot() -> bool:
    return bool(build.load().parley_features() & 1)


# The float kernel; the int8-input product as a decoder asked for it gets it (AVX-512 VNNI where the CPU has it, else
# AVX2's); AVX2's forced (compiled in wherever the CPU has AVX2, VNNI or not: the kernel most people's CPUs take);
# and the portable loops forced, so they are tested on every machine.
INT8_DOT = [False, True, "avx2", "portable"]


def tiny(
    scheme: str, *, bias: bool = False, tied: bool = False, group_size: int = 32, head_dim: int = 64, seed: int = 0,
    heads: int = 4,
) -> Transformer:
    """`heads` // 2 query heads per kv head; head_dim 64 and 256 take the compiled attention kernels, 32 the plain loops."""
    cfg = ModelConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=heads, num_kv_heads=2,
                      head_dim=head_dim, qkv_bias=bias, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(seed)
    model = Transformer(cfg, SEQ).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    quantize_model(model, scheme, group_size=group_size, use_kernel=False)  # type: ignore[arg-type]
    return fuse_projections(model)


def cache_for(model: Transformer, slots: int = 3, dtype: torch.dtype = torch.float32) -> StaticKVCache:
    c = model.cfg
    return StaticKVCache(c.num_layers, slots, c.num_kv_heads, SEQ, c.head_dim, dtype=dtype)


def prefill(model: Transformer, caches: list[StaticKVCache], slot: int, tokens: list[int]) -> None:
    with torch.inference_mode():
        for cache in caches:
            model(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache, [slot], "last", kv_len=len(tokens))


def reference_step(model: Transformer, cache: StaticKVCache, tokens: list[int], positions: list[int], slots: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        t, p = torch.tensor(tokens)[:, None], torch.tensor(positions)[:, None]
        return model(t, p, cache, slots, "last", kv_len=max(positions) + 1)[:, 0]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("int8_dot", INT8_DOT)
@pytest.mark.parametrize(
    "scheme,bias,tied,group_size,head_dim",
    [("none", False, True, 32, 64), ("none", True, False, 32, 32), ("int8", True, False, 32, 64), ("int8", False, True, 32, 32),
     ("int4", False, False, 32, 64), ("int4", True, True, 32, 32), ("int4", False, False, 64, 64), ("int4", False, False, 128, 64),
     ("int4", False, False, 16, 64), ("none", False, False, 32, 256)],
)  # fmt: skip
def test_batched_steps_match_the_float_forward(
    scheme: str, bias: bool, tied: bool, group_size: int, head_dim: int, int8_dot: bool | str
) -> None:
    model = tiny(scheme, bias=bias, tied=tied, group_size=group_size, head_dim=head_dim)
    ref_cache, cache = cache_for(model), cache_for(model)
    decoder = NativeDecoder(model, cache, int8_dot=int8_dot)
    long = [(7 * i + 5) % 300 for i in range(40)]  # >= 16 positions per thread: the vector exp path
    prefill(model, [ref_cache, cache], 0, long)
    prefill(model, [ref_cache, cache], 2, [250, 3])
    tokens, positions, slots = [11, 200], [40, 2], [0, 2]
    # int4 layers take the int8-input path, and int8 ones (an int4 model's too, where a group does not fit) where VNNI
    # runs it; everything else is float32 either way.
    tol = 2e-3 if int8_dot and scheme != "none" else 2e-5
    for _ in range(3):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        got = decoder.decode(tokens, positions, slots)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert relative_error(got, want) < tol
        tokens, positions = [int(t) for t in want.argmax(-1)], [p + 1 for p in positions]
    for slot, length in ((0, 43), (2, 5)):
        for ours, theirs in ((cache.k, ref_cache.k), (cache.v, ref_cache.v)):
            assert relative_error(ours[:, slot, :, :length], theirs[:, slot, :, :length]) < 10 * tol
    assert cache.k[:, 1].abs().max() == 0  # the slot nobody used stays untouched


@pytest.mark.parametrize("kv", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("per_kv", [5, 6, 7, 8, 9])
def test_query_heads_per_kv_head_without_a_kernel_of_their_own_take_the_kernels_four_at_a_time(per_kv: int, kv: torch.dtype) -> None:
    """Qwen2.5's 7 (0.5B) and 6 (1.5B) query heads per kv head: the compiled attention in parts of four heads and the
    rest matches the PyTorch forward on the same cache (float32, float16, int8 keys and values)."""
    model = tiny("none", heads=2 * per_kv, head_dim=64)
    ref_cache, cache = cache_for(model, dtype=kv), cache_for(model, dtype=kv)
    decoder = NativeDecoder(model, cache, int8_dot=False)
    prefill(model, [ref_cache, cache], 0, [(7 * i + 5) % 300 for i in range(40)])
    tokens, positions, slots = [11], [40], [0]
    for _ in range(3):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        got = decoder.decode(tokens, positions, slots)
        assert relative_error(got, want) < (2e-5 if kv == torch.float32 else 2e-2)
        tokens, positions = [int(want[0].argmax())], [positions[0] + 1]


@pytest.mark.parametrize("int8_dot", INT8_DOT)
@pytest.mark.parametrize("scheme,head_dim", [("none", 64), ("int8", 32), ("int4", 64), ("none", 256)])
def test_a_float16_cache_matches_the_float_forward_on_the_same_cache(scheme: str, head_dim: int, int8_dot: bool | str) -> None:
    """Keys and values stored as float16 (the CPU default): the compiled step reads and writes them as the
    PyTorch forward does, rounding this step's own key to the cache's precision before attending to it."""
    model = tiny(scheme, bias=True, head_dim=head_dim)
    ref_cache, cache = cache_for(model, dtype=torch.float16), cache_for(model, dtype=torch.float16)
    full = cache_for(model)  # float32, for the size of the error a half cache brings
    decoder = NativeDecoder(model, cache, int8_dot=int8_dot)
    prefill(model, [ref_cache, cache, full], 0, [(5 * i + 2) % 300 for i in range(40)])
    prefill(model, [ref_cache, cache, full], 1, [77])
    tokens, positions, slots = [42, 9], [40, 1], [0, 1]
    # A float32 key ~1e-7 off the reference's can round to the neighbouring float16 (measured up to 7e-5
    # in the logits on plain x86-64); leaving this step's own key unrounded moves them by ~1e-3.
    tol = 2e-3 if int8_dot and scheme == "int4" else 2e-4
    for _ in range(3):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        assert relative_error(decoder.decode(tokens, positions, slots), want) < tol
        assert relative_error(reference_step(model, full, tokens, positions, slots), want) < 1e-2
        tokens, positions = [int(t) for t in want.argmax(-1)], [p + 1 for p in positions]
    # The float32 keys differ from the reference's by ~1e-7, which can move a float16 rounding by one step.
    for slot, length in ((0, 43), (1, 4)):
        for ours, theirs in ((cache.k, ref_cache.k), (cache.v, ref_cache.v)):
            assert ours.dtype == torch.float16
            assert relative_error(ours[:, slot, :, :length].float(), theirs[:, slot, :, :length].float()) < 2e-3
    assert cache.k[:, 2].abs().max() == 0


@pytest.mark.parametrize("int8_dot", INT8_DOT)
def test_a_row_in_a_batch_gets_what_it_gets_alone(int8_dot: bool | str) -> None:
    model = tiny("int4")
    together, alone = cache_for(model), cache_for(model)
    prompts = {0: [1, 2, 3], 1: [40, 50, 60, 70, 80], 2: [9]}
    for slot, prompt in prompts.items():
        prefill(model, [together, alone], slot, prompt)
    batched = NativeDecoder(model, together, int8_dot=int8_dot).decode([5, 6, 7], [3, 5, 1], [0, 1, 2])
    single = NativeDecoder(model, alone, int8_dot=int8_dot)
    # Float sums in another order differ by ~1e-7; the int8 path rounds each layer's input to 1/32768 of
    # its block's largest value, so such a difference can move one rounding step (~3e-5 of the value).
    atol = 1e-3 if int8_dot else 1e-5
    for i, (tok, pos, slot) in enumerate(zip([5, 6, 7], [3, 5, 1], [0, 1, 2])):
        assert torch.allclose(batched[i], single.decode([tok], [pos], [slot])[0], rtol=0, atol=atol)


@pytest.mark.parametrize("group_size", [32, 64])
def test_the_portable_int8_input_loops_compute_what_the_vnni_kernel_does(group_size: int) -> None:
    """Same rounding of the input into two int8 parts, same integer dot: the portable loops and the VNNI kernel (where
    this CPU has it) differ only in the order of their float sums, which can move single rounding steps of the next
    layer's input (measured 8e-5 and 1.2e-4 of the largest logit, as far as either is from the float kernel), and
    neither is the float kernel's result."""
    model = tiny("int4", group_size=group_size)
    caches = {mode: cache_for(model) for mode in ("float", "portable", "asked", "avx2")}
    for cache in caches.values():
        prefill(model, [cache], 0, [3, 1, 4, 1, 5])
    decoders = {"float": NativeDecoder(model, caches["float"], int8_dot=False),
                "portable": NativeDecoder(model, caches["portable"], int8_dot="portable"),
                "asked": NativeDecoder(model, caches["asked"], int8_dot=True),
                "avx2": NativeDecoder(model, caches["avx2"], int8_dot="avx2")}  # fmt: skip
    assert decoders["portable"].int8_kernel == "portable" and decoders["float"].int8_kernel is None
    avx2 = bool(build.load().parley_features() & 2)
    assert decoders["asked"].int8_kernel == ("vnni" if has_int8_dot() else "avx2" if avx2 else "portable")
    assert decoders["avx2"].int8_kernel == ("avx2" if avx2 else "portable")
    assert "int8-input portable kernel" in kernels_used(model, "portable")
    assert "int8-input AVX2 kernel" in kernels_used(model, "avx2")
    got = {mode: d.decode([9], [5], [0]) for mode, d in decoders.items()}
    assert relative_error(got["portable"], got["asked"]) < 5e-4
    assert relative_error(got["portable"], got["avx2"]) < 5e-4
    assert not torch.equal(got["portable"], got["float"])  # the int8-input rounding, not the float kernel
    assert relative_error(got["portable"], got["float"]) < 2e-3


@pytest.mark.parametrize("int8_dot", INT8_DOT)
@pytest.mark.parametrize("scheme", ["none", "int8", "int4"])
def test_a_prompt_chunk_matches_the_float_forward(scheme: str, int8_dot: bool | str) -> None:
    """A prompt's chunk through the compiled step (sixteen positions of one slot a call, each row attending to the
    ones the call stored before it): the logits of the rows asked for and the keys and values it stores are the
    float forward's, to the int8-input rounding where that path runs; other slots stay untouched."""
    model = tiny(scheme, bias=True)
    ref_cache, cache = cache_for(model), cache_for(model)
    decoder = NativeDecoder(model, cache, int8_dot=int8_dot)
    prefill(model, [ref_cache, cache], 0, [4, 8, 15])  # a neighbour slot, to see it is left alone
    head = [(11 * i + 3) % 300 for i in range(6)]
    chunk = [(7 * i + 5) % 300 for i in range(21)]  # two calls: sixteen rows, then five
    prefill(model, [ref_cache, cache], 1, head)  # what the slot held before this chunk
    with torch.inference_mode():
        want = model(torch.tensor([chunk]), torch.arange(6, 27)[None], ref_cache, [1], (4, 17, 20), kv_len=27)[0]
    got = decoder.prefill(1, chunk, 6, [4, 17, 20])
    tol = 2e-3 if int8_dot and scheme in ("int4", "int8") else 2e-5
    assert got.shape == want.shape and relative_error(got, want) < tol
    for ours, theirs in ((cache.k, ref_cache.k), (cache.v, ref_cache.v)):
        assert relative_error(ours[:, :2, :, :27], theirs[:, :2, :, :27]) < 10 * tol
    assert cache.k[:, 2].abs().max() == 0
    assert decoder.prefill(1, chunk[:3], 27, []).shape == (0, 300)  # no rows asked for: no head, keys stored
    assert cache.k[:, 1, :, 27:30].abs().max() > 0


def test_a_chunk_must_be_one_run_of_positions() -> None:
    model = tiny("int4")
    cache = cache_for(model)
    decoder = NativeDecoder(model, cache)
    before = cache.k.clone()
    with pytest.raises(ValueError, match="run of positions"):
        decoder._forward([1, 2, 3], [0, 2, 3], [1, 1, 1], 3)
    with pytest.raises(ValueError, match="run of positions"):
        decoder._forward([1, 2, 3], [0, 0, 1], [1, 2, 1], 3)  # the slot's rows apart
    with pytest.raises(ValueError, match="prefill"):
        decoder.prefill(1, [1, 2], SEQ - 1, [1])  # past the cache
    assert torch.equal(cache.k, before)


def test_bad_rows_are_refused_before_anything_is_written() -> None:
    model = tiny("int4")
    cache = cache_for(model)
    decoder = NativeDecoder(model, cache)
    before = cache.k.clone()
    bad = [([300], [0], [0], "token id"), ([1], [SEQ], [0], "position"), ([1], [0], [3], "slot"), ([1], [-1], [0], "position")]
    for tokens, positions, slots, what in bad:
        with pytest.raises(ValueError, match=what):
            decoder.decode(tokens, positions, slots)
    with pytest.raises(ValueError, match="rows"):
        decoder.decode([], [], [])
    with pytest.raises(ValueError, match="rows"):
        decoder.decode([1] * 17, list(range(17)), [0] * 17)
    with pytest.raises(ValueError, match="one row per slot"):
        decoder.decode([1, 2], [0, 1], [1, 1])
    assert torch.equal(cache.k, before)


def test_models_it_cannot_run_say_why() -> None:
    unfused = Transformer(tiny("none").cfg, SEQ)
    assert "not fused" in (unsupported(unfused, cache_for(unfused)) or "")
    half = tiny("none").to(torch.bfloat16)
    assert "float32" in (unsupported(half, cache_for(half)) or "")
    model = tiny("none")
    assert "bfloat16" in (unsupported(model, cache_for(model, dtype=torch.bfloat16)) or "")
    with pytest.raises(ValueError, match="not fused"):
        NativeDecoder(unfused, cache_for(unfused))
    decoder, line = native_decoder(unfused, cache_for(unfused), required=False)
    assert decoder is None and line.startswith("torch") and "not fused" in line
    with pytest.raises(ValueError, match="not fused"):
        native_decoder(unfused, cache_for(unfused), required=True)
    decoder, line = native_decoder(tiny("int4"), cache_for(tiny("int4")), required=True)
    assert decoder is not None and line.startswith("compiled")


def test_scales_float16_cannot_hold_are_read_as_float32() -> None:
    """An int4 layer whose scales are not float16 values (GGUF Q4_K's d * sc) keeps them exact: the kernel reads
    float32 pairs, and the decode path line says so."""
    model = tiny("int4")
    layer = model.layers[0].mlp.down_proj
    assert isinstance(layer, Int4WeightOnlyLinear)
    layer.scales.mul_(1 + 2**-20)  # no longer a float16 value
    ref_cache, cache = cache_for(model), cache_for(model)
    prefill(model, [ref_cache, cache], 0, [4, 8, 15])
    decoder = NativeDecoder(model, cache)
    got = decoder.decode([16], [3], [0])
    assert relative_error(got, reference_step(model, ref_cache, [16], [3], [0])) < 2e-3
    if decoder.int8_dot:
        assert "with float32 scales" in kernels_used(model, "vnni")


def test_from_float_int4_scales_are_float16_values() -> None:
    layer = Int4WeightOnlyLinear.from_float(torch.randn(64, 128) * 0.05)
    for t in (layer.scales, layer.minimums):
        assert torch.equal(t.half().float(), t)


def test_no_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.NativeUnavailable, match="g\\+\\+"):
        build.compiler()


def test_a_compile_error_is_reported_with_the_compiler_output(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "decode.cpp"
    broken.write_text("int main( {\n")
    monkeypatch.setattr(build, "SOURCE", broken)
    target = tmp_path / "out" / "lib.so"
    with pytest.raises(build.NativeUnavailable, match="could not build") as info:
        build.build(build.compiler(), target)
    assert "error" in str(info.value) and not target.exists()


def test_the_library_shares_torchs_openmp_runtime() -> None:
    """Two libgomp copies would mean two thread pools fighting over two cores (see llm_engine.threads). CTranslate2
    (the recogniser) carries its own copy, loaded when an earlier test in this process used it: not ours to count."""
    build.load()
    maps = open("/proc/self/maps").read()
    gomps = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line and "ctranslate2" not in line}
    assert len(gomps) == 1 and "torch" in next(iter(gomps)), gomps


@pytest.fixture(scope="module")
def smol_int4(smol_path):
    from llm_engine.engine import Engine

    engine = Engine.from_path(smol_path, max_seq_len=256, max_slots=2, quant="int4", native="off")
    return engine.model, engine.tokenizer


@pytest.mark.parametrize("int8_dot", [False, True])  # True: VNNI, or the portable loops on a CPU without it
def test_embedded_int4_greedy_is_the_float_forwards(smol_int4, int8_dot: bool | str) -> None:
    """SmolLM2's own Q4_1 weights: the compiled step's greedy reply is the exact float32 forward's."""
    from llm_engine.request import ChatMessage

    model, tokenizer = smol_int4
    with exact_float(model):
        for question in ("What is the capital of France?", "How do I boil an egg?"):
            prompt = tokenizer.apply_chat_template([ChatMessage("user", question)])
            n = len(prompt)
            ref_cache, cache = cache_for_smol(model), cache_for_smol(model)
            prefill(model, [ref_cache, cache], 0, prompt[:-1])
            decoder = NativeDecoder(model, cache, int8_dot=int8_dot)
            ours, theirs, worst = prompt[-1], prompt[-1], 0.0
            for i in range(16):
                got = decoder.decode([ours], [n - 1 + i], [0])[0]
                want = reference_step(model, ref_cache, [theirs], [n - 1 + i], [0])[0]
                worst = max(worst, float((got - want).abs().max()))
                ours, theirs = int(got.argmax()), int(want.argmax())
                assert ours == theirs, f"{question!r}: step {i} differs"
            assert worst < (0.05 if int8_dot else 1e-3)


def cache_for_smol(model: Transformer, dtype: torch.dtype = torch.float32) -> StaticKVCache:
    c = model.cfg
    return StaticKVCache(c.num_layers, 1, c.num_kv_heads, 256, c.head_dim, dtype=dtype)


def test_embedded_float16_cache_keeps_the_greedy_reply(smol_int4) -> None:
    """The CPU default keeps keys and values in float16: on SmolLM2 (exact float32 math otherwise) that
    moves logits by a few hundredths (measured <= 0.033 over 48 tokens of three prompts) and no greedy
    token; the compiled step on that cache matches the PyTorch forward on it."""
    from llm_engine.request import ChatMessage

    model, tokenizer = smol_int4
    with exact_float(model):
        for question in ("What is the capital of France?", "Tell me a story about a dragon."):
            prompt = tokenizer.apply_chat_template([ChatMessage("user", question)])
            n = len(prompt)
            full, half, compiled = cache_for_smol(model), cache_for_smol(model, torch.float16), cache_for_smol(model, torch.float16)
            prefill(model, [full, half, compiled], 0, prompt[:-1])
            decoder = NativeDecoder(model, compiled)
            token, half_error, compiled_error = prompt[-1], 0.0, 0.0
            for i in range(24):
                want = reference_step(model, full, [token], [n - 1 + i], [0])[0]
                got_half = reference_step(model, half, [token], [n - 1 + i], [0])[0]
                got_compiled = decoder.decode([token], [n - 1 + i], [0])[0]
                half_error = max(half_error, float((got_half - want).abs().max()))
                compiled_error = max(compiled_error, float((got_compiled - got_half).abs().max()))
                token = int(want.argmax())
                assert int(got_half.argmax()) == token == int(got_compiled.argmax()), f"{question!r}: step {i} differs"
            assert half_error < 0.1 and compiled_error < 0.05, (half_error, compiled_error)


def test_engine_says_which_decode_path_it_took(smol_int4) -> None:
    from llm_engine.engine import Engine

    model, tokenizer = smol_int4
    on = Engine(model, tokenizer, max_seq_len=128, max_slots=1, kv_dtype=torch.float16)
    assert on.native is not None and on.decode_path.startswith("compiled CPU step") and on.cache.k.dtype == torch.float16
    off = Engine(model, tokenizer, max_seq_len=128, max_slots=1, native="off")
    assert off.native is None and off.decode_path == "torch"
    with pytest.raises(ValueError, match="native must be"):
        Engine(model, tokenizer, max_seq_len=128, max_slots=1, native="maybe")



def test_decode_path_says_when_lone_requests_speculate_instead(smol_int4) -> None:
    from llm_engine.engine import Engine

    _, tokenizer = smol_int4
    target, draft = tiny("none", seed=1), tiny("int4", seed=1)
    engine = Engine(target, tokenizer, max_seq_len=SEQ, max_slots=2, draft=draft)
    assert engine.native is not None
    assert engine.decode_path.startswith("compiled CPU step") and engine.decode_path.endswith("speculates (torch)")


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_a_team_of_any_size_gets_the_same_logits(threads: int) -> None:
    """The step's own barrier (barrier.h) with one thread, and with more threads than this machine has cores, where
    waiters run out of spin and sleep: every step still equals the float forward, and the next step sees this one's keys."""
    model = tiny("int4", head_dim=64)
    ref_cache, cache = cache_for(model), cache_for(model)
    decoder = NativeDecoder(model, cache, threads=threads)
    prefill(model, [ref_cache, cache], 0, [(3 * i + 1) % 300 for i in range(40)])
    tokens, positions, slots = [17], [40], [0]
    for _ in range(8):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        assert relative_error(decoder.decode(tokens, positions, slots), want) < 2e-3
        tokens, positions = [int(want.argmax(-1)[0])], [positions[0] + 1]
