"""Decoder-only Llama-family transformer (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3, Gemma 3), with per-layer sliding windows.

It reads and writes keys/values through a StaticKVCache at explicit positions and slots, so one
forward serves prefill, decode and (later) batches of slots. It knows nothing about tokens as text,
sampling, sessions or files. Parameter names follow Hugging Face's (minus the "model." prefix).
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.config import ModelConfig, RopeScaling
from llm_engine.kv_cache import StaticKVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the storage dtype: bfloat16 variance loses too much.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """-> [head_dim // 2] float32 inverse frequencies, with linear, Llama-3 or per-frequency scaling applied.
    On the CPU whatever the default device: a model built on "meta" would otherwise compute them through torch._refs,
    whose first use imports torch._dynamo (~2 s of a 2-core server start)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if scaling.rope_type == "freq_factors":
        if len(scaling.freq_factors) != head_dim // 2:
            raise ValueError(f"rope freq_factors has {len(scaling.freq_factors)} values, head_dim {head_dim} needs {head_dim // 2}")
        return inv / torch.tensor(scaling.freq_factors, dtype=torch.float32, device="cpu")
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    if scaling.rope_type != "llama3":
        return inv
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_ctx = scaling.original_max_position_embeddings
    low_wavelen = old_ctx / scaling.low_freq_factor
    high_wavelen = old_ctx / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_band, blended, scaled)


def rope_tables(cfg: ModelConfig, max_seq_len: int, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """-> cos, signed sin [max_seq_len, head_dim] float32, the rotate-half layout (halves duplicated) with
    the rotation's sign folded into the first half of sin, so apply_rope needs no negation. On the CPU, as above.
    local: the tables of windowed layers where they have their own base (Gemma 3: 10,000, unscaled)."""
    if local and cfg.rope_local_theta:
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_local_theta, RopeScaling())
    else:
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)  # [D/2]
    pos = torch.arange(max_seq_len, dtype=torch.float32, device="cpu")
    freqs = torch.outer(pos, inv)  # [S, D/2]
    return torch.cat([freqs, freqs], dim=-1).cos(), torch.cat([-freqs.sin(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/signed_sin [B, 1, T, D] -> rotated x: x*cos + (x2, x1)*(-sin, sin), same dtype."""
    swapped = x.roll(x.shape[-1] // 2, dims=-1)  # (x2, x1)
    return (x * cos + swapped * signed_sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.window = cfg.window(layer)  # 0: attends to the whole context
        self.local_rope = bool(self.window and cfg.rope_local_theta)  # rotates by the model's local tables
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        # Qwen3, Gemma 3: each head's query and key RMS-normalised over head_dim before rope
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.qkv_proj: nn.Module | None = None  # set by fuse.fuse_projections, replacing the three above

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> q [B, H, T, D] and k [B, Hkv, T, D] rotated, v [B, Hkv, T, D].

        Queries and keys are rotated in one call, as one [B, H + Hkv, T, D] tensor (views of it come back).
        """
        b, t, _ = x.shape
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)
        else:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        heads = qkv.view(b, t, self.n_heads + 2 * self.n_kv, self.head_dim).transpose(1, 2)  # [B, H+2Hkv, T, D]
        qk = heads[:, : self.n_heads + self.n_kv]
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, : self.n_heads]), self.k_norm(qk[:, self.n_heads :])], dim=1)
        qk = apply_rope(qk, cos, sin)
        return qk[:, : self.n_heads], qk[:, self.n_heads :], heads[:, self.n_heads + self.n_kv :]

    def forward(
        self,
        x: torch.Tensor,  # [B, T, hidden]
        cos: torch.Tensor,  # [B, 1, T, D]
        sin: torch.Tensor,
        input_pos: torch.Tensor,  # [B, T]
        mask: torch.Tensor | None,  # [B, 1, T, kv_len] bool, None = every cached key is visible
        cache: StaticKVCache,
        slots: Sequence[int],
        kv_len: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        cache.write(self.layer, slots, input_pos, k, v)
        keys, values = cache.read(self.layer, slots, kv_len)  # [B, Hkv, kv_len, D]
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a no-op unless a float16 cache under a float32 model
        if t == 1 and mask is None and self.window:  # one row at position kv_len - 1: its window is a slice
            keys, values = keys[:, :, max(0, kv_len - self.window) :], values[:, :, max(0, kv_len - self.window) :]
        if t == 1 and mask is None:
            # One query per row that sees every key: the G query heads sharing a kv head are just G queries
            # of that head, so plain attention over [B, Hkv, G, D] is grouped attention without the repeat.
            out = F.scaled_dot_product_attention(q.reshape(b, self.n_kv, -1, self.head_dim), keys, values)
            return self.o_proj(out.reshape(b, 1, self.n_heads * self.head_dim))  # [B, 1, hidden]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))  # [B, T, hidden]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # set by fuse.fuse_projections, replacing gate and up
        self.gelu = cfg.hidden_act == "gelu_tanh"  # Gemma's GeGLU, else SwiGLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up)


class Block(nn.Module):
    """Pre-norm residual block. Gemma 3 also normalises each sublayer's output before adding it ("sandwich"):
    there post_attention_layernorm is that output norm, and the MLP has its own pre and post norms (Hugging
    Face's names); elsewhere post_attention_layernorm is the norm before the MLP."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.sandwich = cfg.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def add_attention(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The residual stream after the attention sublayer, given its output."""
        return x + (self.post_attention_layernorm(attn_out) if self.sandwich else attn_out)

    def add_mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream after the MLP sublayer."""
        if self.sandwich:
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x: torch.Tensor, *attn_args: object) -> torch.Tensor:
        return self.add_mlp(self.add_attention(x, self.self_attn(self.input_layernorm(x), *attn_args)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_seq_len = max_seq_len
        # On "meta" (a loader's skeleton) the embedding's random init and the rope tables' arithmetic would go through
        # torch._refs, whose first use imports torch._dynamo: ~2 s of a 2-core server start, for nothing.
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if weight.device.type != "meta":
            nn.init.normal_(weight)  # what nn.Embedding does itself
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.set_rope(weight.device)

    def set_rope(self, device: torch.device | str) -> None:
        """(Re)build the rope tables on device: made on the CPU, moved. rope_cos/rope_sin [max_seq, D] float32 for
        global layers; rope_cos_local/rope_sin_local for windowed ones (the same tensors unless the model has a
        local base). Non-persistent buffers, so a state dict never carries them."""
        cos, sin = (t.to(device) for t in rope_tables(self.cfg, self.max_seq_len))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.cfg.rope_local_theta:
            cos, sin = (t.to(device) for t in rope_tables(self.cfg, self.max_seq_len, local=True))
        self.register_buffer("rope_cos_local", cos, persistent=False)
        self.register_buffer("rope_sin_local", sin, persistent=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids -> the first hidden states; Gemma scales them by sqrt(hidden), in the embedding's dtype."""
        x = self.embed_tokens(tokens)
        return x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype) if self.cfg.embed_scale != 1.0 else x

    def rope_at(self, input_pos: torch.Tensor, dtype: torch.dtype) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """-> {local: (cos, sin) [B, 1, T, D]} for positions [B, T]: the global tables (False) and the local ones (True)."""
        out = {False: (self.rope_cos[input_pos].unsqueeze(1).to(dtype), self.rope_sin[input_pos].unsqueeze(1).to(dtype))}
        if self.cfg.rope_local_theta:
            out[True] = (self.rope_cos_local[input_pos].unsqueeze(1).to(dtype), self.rope_sin_local[input_pos].unsqueeze(1).to(dtype))
        else:
            out[True] = out[False]
        return out

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] int64
        input_pos: torch.Tensor,  # [B, T] int64 positions, also the cache rows written
        cache: StaticKVCache,
        slots: Sequence[int],  # [B] cache slot per row
        logits_for: Literal["last", "all"] | Sequence[int] = "last",
        kv_len: int | None = None,  # cached positions to attend over; the scheduler knows it host-side
    ) -> torch.Tensor:
        """-> logits float32 [B, T, vocab] ("all"), [B, 1, vocab] ("last") or [B, len(idx), vocab] for a sequence
        of indices into T (the head runs only on the rows asked for: it is the largest matrix of a small model)."""
        if kv_len is None:
            kv_len = int(input_pos.max()) + 1  # a device sync on GPU: callers on the hot path pass it
        x = self.embed(tokens)  # [B, T, hidden]
        ropes = self.rope_at(input_pos, x.dtype)  # cos, sin [B, 1, T, D]
        masks = {w: causal_mask(input_pos, kv_len, w) for w in {b.self_attn.window for b in self.layers}}
        for block in self.layers:
            attn = block.self_attn
            x = block(x, *ropes[attn.local_rope], input_pos, masks[attn.window], cache, slots, kv_len)
        if logits_for == "last":
            x = x[:, -1:]
        elif logits_for != "all":
            x = x[:, list(logits_for)]
        return self.logits(self.norm(x))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Normed hidden states [..., hidden] -> float32 logits [..., vocab]. With tied embeddings and no
        separate (quantized) head module, the embedding matrix is the head."""
        if self.lm_head is None:
            return F.linear(x, self.embed_tokens.weight).float()
        return self.lm_head(x).float()


def causal_mask(input_pos: torch.Tensor, kv_len: int, window: int = 0) -> torch.Tensor | None:
    """-> [B, 1, T, kv_len] bool (key position <= query position, and > query position - window if window), or
    None for a single decode row (it sees every cached key, or under a window the last `window`: a slice)."""
    if input_pos.shape == (1, 1):
        return None
    key_pos = torch.arange(kv_len, device=input_pos.device)[None, None, :]  # [1, 1, kv_len]
    query_pos = input_pos[:, :, None]  # [B, T, 1]
    mask = key_pos <= query_pos
    if window:
        mask &= key_pos > query_pos - window
    return mask.unsqueeze(1)
