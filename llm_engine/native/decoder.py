"""The compiled CPU decode step: a llm_engine.batch.Decoder, decode(tokens, positions, slots).

It describes the model to decode.cpp once (pointers into the model's own tensors and the KV cache, no
copies) and then runs each step as one foreign call, which releases the GIL. A prompt's chunks run through it
too, sixteen positions of one slot a call (`prefill`); speculation and anything the library cannot describe stay
on the PyTorch path. It knows the model's layer classes and
the cache layout; it knows nothing about requests or sampling.
"""
from __future__ import annotations

import ctypes
from typing import Literal, Sequence

import torch
from torch import nn

from llm_engine.kv_cache import StaticKVCache
from llm_engine.model import Transformer
from llm_engine.native.build import NativeUnavailable, load
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear

MAX_ROWS = 16  # matvec::kMaxRows in matvec.h
MAX_HEAD_DIM = 512  # kMaxHeadDim in decode.cpp


class PLinear(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("group", ctypes.c_int32),
        ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("mins", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("dm", ctypes.c_void_p), ("dm32", ctypes.c_void_p), ("kblocks", ctypes.c_void_p),
    ]


class PLayer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", ctypes.c_void_p), ("mlp_norm", ctypes.c_void_p), ("attn_out_norm", ctypes.c_void_p),
        ("mlp_out_norm", ctypes.c_void_p), ("qkv", PLinear), ("o", PLinear), ("gate_up", PLinear), ("down", PLinear),
        ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p), ("window", ctypes.c_int32), ("local_rope", ctypes.c_int32),
    ]


class PModel(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int32) for name in (
            "n_layers", "hidden", "n_heads", "n_kv", "head_dim", "inter", "vocab", "max_seq", "n_slots", "max_rows",
            "int4_dot", "kv_kind", "gelu")),
        ("eps", ctypes.c_float), ("embed_scale", ctypes.c_float), ("embed", ctypes.c_void_p), ("final_norm", ctypes.c_void_p),
        ("head", PLinear), ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p), ("rope_cos_local", ctypes.c_void_p),
        ("rope_sin_local", ctypes.c_void_p), ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p), ("k_scale", ctypes.c_void_p), ("v_scale", ctypes.c_void_p),
        ("layers", ctypes.POINTER(PLayer)),
    ]


KV_KINDS = {torch.float32: 0, torch.float16: 1, torch.int8: 2}  # KV_* in abi.h
INT8DOT_CODES = {None: 0, "vnni": 1, "portable": 2, "avx2": 3}  # INT8DOT_* in abi.h
_KERNEL_NAMES = {"vnni": "VNNI", "avx2": "AVX2"}
_ERRORS = {1: "row count", 2: "token id", 3: "position", 4: "slot", 5: "a slot's run of positions"}


def unsupported(model: Transformer, cache: StaticKVCache) -> str | None:
    """Why the compiled step cannot run this model and cache, or None if it can."""
    if cache.k.device.type != "cpu":
        return "the model is not on the CPU"
    if next(model.parameters()).dtype != torch.float32:
        return "it computes in float32 only"
    if cache.k.dtype not in KV_KINDS:
        return f"it keeps keys and values in float32, float16 or int8, not {cache.k.dtype}"
    if any(b.self_attn.qkv_proj is None or b.mlp.gate_up_proj is None for b in model.layers):
        return "projections are not fused (llm_engine.fuse.fuse_projections)"
    if model.cfg.head_dim % 2 or model.cfg.head_dim > MAX_HEAD_DIM:
        return f"head_dim {model.cfg.head_dim} is odd or over {MAX_HEAD_DIM}"
    for layer in _linears(model):
        if not isinstance(layer, (nn.Linear, Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
            return f"no kernel for {type(layer).__name__}"
    return None


def _linears(model: Transformer) -> list[nn.Module]:
    out: list[nn.Module] = []
    for b in model.layers:
        out += [b.self_attn.qkv_proj, b.self_attn.o_proj, b.mlp.gate_up_proj, b.mlp.down_proj]
    return out + ([model.lm_head] if model.lm_head is not None else [])


def kernels_used(model: Transformer, int8_kernel: str | None) -> str:
    """What the step's matrix products actually run on, by matrix count: "int4 on the int8-input VNNI kernel with
    float16 scales: 96 matrices; int8: 1 matrix". int8_kernel: NativeDecoder.int8_kernel ("vnni", "avx2",
    "portable": the int8-input product in plain loops, or None: the float kernels)."""
    counts: dict[str, int] = {}
    for layer in _linears(model):
        if isinstance(layer, Int4WeightOnlyLinear):
            pairs = torch.stack([layer.scales, layer.minimums], -1)
            scales = "Q4_K factors" if _kblocks_exact(layer) else "float16 scales" if torch.equal(pairs.half().float(), pairs) else "float32 scales"
            if int8_kernel in ("vnni", "avx2") and scales == "Q4_K factors":  # matvec.h: the super-block kernel on both
                kind = "int4 on the int8-input AVX2 super-block kernel with Q4_K factors"
            else:
                kind = ("int4 on the float kernel" if not int8_kernel else "int4 on the int8-input portable kernel"
                        if int8_kernel == "portable" else f"int4 on the int8-input {_KERNEL_NAMES[int8_kernel]} kernel with {scales}")  # fmt: skip
        elif isinstance(layer, Int8WeightOnlyLinear):
            kind = f"int8 on the int8-input {_KERNEL_NAMES[int8_kernel]} kernel" if int8_kernel in ("vnni", "avx2") else "int8"
        else:
            kind = "float32"
        counts[kind] = counts.get(kind, 0) + 1
    if model.lm_head is None:
        counts["float32 (the tied head)"] = 1
    return "; ".join(f"{kind}: {n} matri{'ces' if n > 1 else 'x'}" for kind, n in counts.items())


def _ptr(t: torch.Tensor | None, keep: list[torch.Tensor]) -> int | None:
    if t is None:
        return None
    t = t.detach().float().contiguous()  # a no-op for the model's own float32 tensors
    keep.append(t)
    return t.data_ptr()


def describe_linear(layer: nn.Module, keep: list[torch.Tensor]) -> PLinear:
    if isinstance(layer, Int4WeightOnlyLinear):
        keep.append(layer.packed)
        kblocks = layer.kblocks if _kblocks_exact(layer) else None
        half = None if kblocks is not None else _half_pairs(layer, keep)
        wide = None if kblocks is not None or half is not None else _ptr(torch.stack([layer.scales, layer.minimums], -1), keep)
        if kblocks is not None:
            keep.append(kblocks)
        return PLinear(2, layer.out_features, layer.in_features, layer.group_size, layer.packed.data_ptr(),
                       _ptr(layer.scales, keep), _ptr(layer.minimums, keep), _ptr(layer.bias, keep), half, wide,
                       None if kblocks is None else kblocks.data_ptr())  # fmt: skip
    if isinstance(layer, Int8WeightOnlyLinear):
        keep.append(layer.qweight)
        return PLinear(1, layer.out_features, layer.in_features, 0, layer.qweight.data_ptr(),
                       _ptr(layer.scales, keep), None, _ptr(layer.bias, keep))
    assert isinstance(layer, nn.Linear)
    return describe_dense(layer.weight, layer.bias, keep)


def describe_dense(weight: torch.Tensor, bias: torch.Tensor | None, keep: list[torch.Tensor]) -> PLinear:
    """A float32 layer: an nn.Linear's weight, or the tied embedding read as the head."""
    n, k = weight.shape
    return PLinear(0, n, k, 0, _ptr(weight, keep), None, None, _ptr(bias, keep))


def _kblocks_exact(layer: Int4WeightOnlyLinear) -> bool:
    """Whether the layer carries Q4_K factors that give exactly its float32 (scale, minimum) pairs."""
    kb = layer.kblocks
    if kb is None or layer.group_size != 32 or layer.in_features % 256:
        return False
    if kb.dtype != torch.uint8 or tuple(kb.shape) != (layer.out_features, layer.in_features // 256, 24) or not kb.is_contiguous():
        return False
    sm = kb[..., :16].float().view(layer.out_features, -1, 8, 2)  # [N, nb, 8 groups, (sc, m)]
    dn = kb[..., 16:].contiguous().view(torch.float32).view(layer.out_features, -1, 1, 2)  # [N, nb, 1, (d, -dmin)]
    pairs = (sm * dn).view(layer.out_features, -1, 2)
    return torch.equal(pairs[..., 0], layer.scales) and torch.equal(pairs[..., 1], layer.minimums)


def _half_pairs(layer: Int4WeightOnlyLinear, keep: list[torch.Tensor]) -> int | None:
    """(scale, minimum) per group as float16 pairs [N, G, 2] for the int8-input kernel, which reads them at
    half the bytes; None (the kernel reads float32 pairs) unless float16 holds them exactly, as it does
    for GGUF Q4_0/Q4_1 blocks and for Int4WeightOnlyLinear.from_float (not for Q4_K's d * sc)."""
    pairs = torch.stack([layer.scales, layer.minimums], dim=-1)
    half = pairs.to(torch.float16).contiguous()
    if not torch.equal(half.float(), pairs):
        return None
    keep.append(half)
    return half.data_ptr()


class NativeDecoder:
    """A llm_engine.batch.Decoder for up to max_rows single-token rows, compiled.

    Holds pointers into the model and cache: neither may be moved or re-quantized while it lives.
    Raises NativeUnavailable (no compiler, load failure) or ValueError (a model it cannot run).
    """

    max_rows = MAX_ROWS

    def __init__(
        self, model: Transformer, cache: StaticKVCache, *, threads: int | None = None,
        int8_dot: bool | Literal["portable", "avx2"] | None = None,
    ) -> None:
        """int8_dot: int4 and int8 layers take the int8-input product (the input split into two int8 parts per 32
        values, ~16 bits): True = the fastest kernel compiled in (AVX-512 VNNI, ~2x the float kernel, else AVX2's
        maddubs), "avx2" = the AVX2 one even where VNNI is there (tests and benchmarks of the CPUs most people
        have), "portable" = the same arithmetic in plain loops (slower than the float kernel: for tests on every
        machine); None = True where a fast kernel is compiled in, else the float kernels. threads: None = torch's
        count at each call."""
        reason = unsupported(model, cache)
        if reason is not None:
            raise ValueError(f"the compiled decode step cannot run this model: {reason}")
        self.lib = load()
        abi = ctypes.sizeof(PLinear) * 1000 + ctypes.sizeof(PLayer) * 10 + ctypes.sizeof(PModel) % 10
        if self.lib.parley_abi() != abi:
            raise NativeUnavailable(f"decode.cpp's structs do not match decoder.py's ({self.lib.parley_abi()} != {abi})")
        self.model, self.cache, self.threads = model, cache, threads
        compiled = compiled_kernels()
        if int8_dot not in (None, True, False, "portable", "avx2"):
            raise ValueError(f"int8_dot is True, False, 'portable', 'avx2' or None, not {int8_dot!r}")
        self.int8_dot = bool(compiled) if int8_dot is None else bool(int8_dot)
        # which int8-input kernel: "vnni", "avx2", "portable" (none compiled here, or asked for), or None (the float kernels)
        if not self.int8_dot:
            self.int8_kernel: str | None = None
        elif int8_dot in ("portable", "avx2"):
            self.int8_kernel = int8_dot if int8_dot in compiled or int8_dot == "portable" else "portable"
        else:
            self.int8_kernel = compiled[0] if compiled else "portable"
        if model.rope_cos.shape[0] < cache.max_seq_len or model.rope_cos_local.shape[0] < cache.max_seq_len:
            raise ValueError(f"the model's rope table ({model.rope_cos.shape[0]}) is shorter than the cache")
        cfg = model.cfg
        keep: list[torch.Tensor] = []
        layers = (PLayer * cfg.num_layers)()
        for i, b in enumerate(model.layers):
            mlp_norm, out_norms = b.post_attention_layernorm, (None, None)
            if b.sandwich:  # Gemma 3: post_attention_layernorm is the attention's output norm
                mlp_norm, out_norms = b.pre_feedforward_layernorm, (b.post_attention_layernorm.weight, b.post_feedforward_layernorm.weight)
            layers[i] = PLayer(
                _ptr(b.input_layernorm.weight, keep), _ptr(mlp_norm.weight, keep), *(_ptr(w, keep) for w in out_norms),
                describe_linear(b.self_attn.qkv_proj, keep), describe_linear(b.self_attn.o_proj, keep),
                describe_linear(b.mlp.gate_up_proj, keep), describe_linear(b.mlp.down_proj, keep),
                _ptr(b.self_attn.q_norm.weight if b.self_attn.q_norm is not None else None, keep),
                _ptr(b.self_attn.k_norm.weight if b.self_attn.k_norm is not None else None, keep), b.self_attn.window,
                int(b.self_attn.local_rope),
            )
        head = (describe_linear(model.lm_head, keep) if model.lm_head is not None
                else describe_dense(model.embed_tokens.weight, None, keep))  # fmt: skip
        self._desc = PModel(
            cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            cfg.vocab_size, cache.max_seq_len, cache.num_slots, MAX_ROWS, INT8DOT_CODES[self.int8_kernel],
            KV_KINDS[cache.k.dtype], int(cfg.hidden_act == "gelu_tanh"), cfg.rms_norm_eps, cfg.embed_scale,
            _ptr(model.embed_tokens.weight, keep), _ptr(model.norm.weight, keep), head,
            *(_ptr(t[: cache.max_seq_len], keep) for t in (model.rope_cos, model.rope_sin, model.rope_cos_local, model.rope_sin_local)),
            cache.k.data_ptr(), cache.v.data_ptr(), *(None if t is None else t.data_ptr() for t in (cache.k_scale, cache.v_scale)),
            layers,
        )
        self._layers, self._keep = layers, keep  # the structs point into these: they live as long as we do

    @torch.inference_mode()
    def decode(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        b = len(tokens)
        if not 1 <= b <= MAX_ROWS or len(positions) != b or len(slots) != b:
            raise ValueError(f"decode takes 1..{MAX_ROWS} rows of (token, position, slot), got {b}")
        if len(set(slots)) != b:  # a row would attend over a position another row is writing
            raise ValueError(f"decode takes one row per slot, got slots {list(slots)}")
        return self._forward(tokens, positions, slots, 0)

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: Sequence[int], start: int, want: Sequence[int]) -> torch.Tensor:
        """A prompt's chunk into `slot` from position `start`, MAX_ROWS tokens a call (each call reads the weights
        once for all its rows) -> logits [len(want), V] of the chunk's rows `want` (indices into `tokens`)."""
        n = len(tokens)
        if n < 1 or start < 0 or start + n > self.cache.max_seq_len or any(not 0 <= w < n for w in want):
            raise ValueError(f"prefill: {n} tokens from {start} (cache {self.cache.max_seq_len}), rows {list(want)}")
        picked: dict[int, torch.Tensor] = {}
        for c0 in range(0, n, MAX_ROWS):
            c1 = min(n, c0 + MAX_ROWS)
            wanted = [w for w in want if c0 <= w < c1]
            head_from = min(wanted) - c0 if wanted else c1 - c0  # the head only over the rows asked for
            logits = self._forward(tokens[c0:c1], range(start + c0, start + c1), [slot] * (c1 - c0), head_from)
            for w in wanted:
                picked[w] = logits[w - c0 - head_from]
        return torch.stack([picked[w] for w in want]) if want else torch.empty(0, self.model.cfg.vocab_size)

    def _forward(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int], head_from: int) -> torch.Tensor:
        b = len(tokens)
        rows = (ctypes.c_int64 * (3 * b))(*tokens, *positions, *slots)
        logits = torch.empty(b - head_from, self.model.cfg.vocab_size)
        base, size = ctypes.addressof(rows), ctypes.sizeof(ctypes.c_int64)
        threads = self.threads or torch.get_num_threads()
        code = self.lib.parley_forward(ctypes.byref(self._desc), b, base, base + b * size, base + 2 * b * size,
                                       logits.data_ptr(), threads, head_from)
        if code != 0:
            raise ValueError(f"decode: {_ERRORS.get(code, code)} out of range in {list(zip(tokens, positions, slots))}")
        return logits


def compiled_kernels() -> list[str]:
    """The int8-input kernels the library built for this CPU has, fastest first: "vnni", "avx2"; [] where neither."""
    features = load().parley_features()
    return [name for bit, name in ((1, "vnni"), (2, "avx2")) if features & bit]


def default_kernel() -> str | None:
    """The int8-input kernel a NativeDecoder takes unless told otherwise (None: the float kernels)."""
    kernels = compiled_kernels()
    return kernels[0] if kernels else None


def native_decoder(model: Transformer, cache: StaticKVCache, *, required: bool) -> tuple[NativeDecoder | None, str]:
    """-> (the compiled step, or None where it cannot run here, and a line saying which path decode takes
    and why). required: raise ValueError instead of returning None."""
    reason = unsupported(model, cache)
    if reason is None:
        try:
            decoder = NativeDecoder(model, cache)
            return decoder, f"compiled CPU step ({kernels_used(model, decoder.int8_kernel)})"
        except NativeUnavailable as exc:
            reason = str(exc)
    if required:
        raise ValueError(f"the compiled decode step was asked for, but {reason}")
    return None, f"torch (no compiled CPU step: {reason})"
