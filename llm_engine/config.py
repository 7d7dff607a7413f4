"""ModelConfig: the shape of a Llama-family model, read from a Hugging Face config.json or GGUF metadata.

It knows nothing about weights, devices or tokenizers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")  # HF model_type / GGUF general.architecture
HF_ALIASES = {"gemma3_text": "gemma3"}  # HF model_type -> ours (a multimodal `gemma3` folder nests its text config)


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"  # "default" | "linear" | "llama3" | "freq_factors"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # "freq_factors": each rotary frequency divided by its own factor [head_dim // 2], as a GGUF's `rope_freqs`
    # tensor carries Llama 3 scaling (llama.cpp's converter bakes the scaling into these numbers)
    freq_factors: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v projections
    qk_norm: bool = False  # Qwen3 RMS-normalises each head's query and key (over head_dim) before rope
    max_position_embeddings: int = 2048
    architecture: str = "llama"
    # Sliding-window attention, one entry per layer (empty: every layer global): a layer with window W > 0
    # attends to its own position and the W - 1 before it (Mistral: every layer; Gemma 3: five local to one global)
    layer_windows: tuple[int, ...] = ()
    hidden_act: str = "silu"  # the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU)
    rope_local_theta: float = 0.0  # windowed layers' own rope base, unscaled (Gemma 3: 10,000); 0 = rope_theta's tables
    # Gemma 3 attends with scale query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5 (0 = head_dim); the
    # loader folds the difference into the query norm's weight.
    query_pre_attn_scalar: float = 0.0
    # Added to every RMSNorm weight on load: Gemma's Hugging Face checkpoints store w for a (1 + w) scale (its GGUFs,
    # and our cache folders, store 1 + w)
    norm_weight_offset: float = 0.0

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 3: each sublayer's output is RMS-normalised before the residual add."""
        return self.architecture == "gemma3"

    @property
    def embed_scale(self) -> float:
        """Gemma scales the embedding rows by sqrt(hidden) on the way in (not as the tied head)."""
        return self.hidden_size**0.5 if self.architecture == "gemma3" else 1.0

    def window(self, layer: int) -> int:
        """The layer's attention window in positions; 0 = the whole context."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        model_type = HF_ALIASES.get(cfg.get("model_type", "llama"), cfg.get("model_type", "llama"))
        if model_type not in ARCHITECTURES or (model_type == "gemma3" and "hidden_size" not in cfg):
            raise ValueError(f"unsupported model_type {cfg.get('model_type')!r}: Parley runs {', '.join(ARCHITECTURES)}"
                             + (" (of Gemma 3, the text-only gemma3_text)" if model_type == "gemma3" else ""))  # fmt: skip
        gemma = model_type == "gemma3"
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
        if act not in ("silu", "gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"unsupported hidden_act {act!r}: Parley's MLPs gate with silu or tanh-approximated gelu")
        for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(cap):
                raise ValueError(f"unsupported {cap} {cfg[cap]}: Parley does not soft-cap logits")
        # transformers 5 writes rope settings under rope_parameters; older configs use rope_theta + rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        local = dict(rope.get("sliding_attention") or {})  # Gemma 3: one set per layer type
        rope = dict(rope.get("full_attention") or rope)
        local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0 if gemma else 0.0)))
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported rope type {local['rope_type']!r} on sliding layers")
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 1e6 if gemma else 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3", "freq_factors"):
            raise ValueError(f"unsupported rope type {rope_type!r}: Parley knows default, linear and llama3")
        scaling = RopeScaling(
            rope_type=rope_type,
            factor=float(rope.get("factor", 1.0)),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(rope.get("original_max_position_embeddings", 8192)),
            freq_factors=tuple(float(f) for f in rope.get("freq_factors", ())),
        )
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type in ("qwen3", "gemma3"),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            architecture=model_type,
            layer_windows=hf_layer_windows(cfg, layers),
            hidden_act="silu" if act == "silu" else "gelu_tanh",
            rope_local_theta=local_theta if gemma else 0.0,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 0.0) or 0.0) if gemma else 0.0,
            norm_weight_offset=float(cfg.get("parley_norm_weight_offset", 1.0 if gemma else 0.0)),
        )

    @classmethod
    def from_json_file(cls, path: Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF-style config.json, so a converted GGUF cache folder looks like any HF folder."""
        rope: dict[str, Any] = {"rope_type": self.rope_scaling.rope_type, "rope_theta": self.rope_theta}
        if self.rope_scaling.rope_type != "default":
            rope.update({k: v for k, v in asdict(self.rope_scaling).items() if k != "rope_type"})
            if not self.rope_scaling.freq_factors:
                del rope["freq_factors"]
        if self.rope_local_theta:
            rope = {"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_local_theta}}
        gemma = {"query_pre_attn_scalar": self.query_pre_attn_scalar, "parley_norm_weight_offset": self.norm_weight_offset}
        return {
            "model_type": self.architecture,
            "hidden_act": "silu" if self.hidden_act == "silu" else "gelu_pytorch_tanh",
            **(gemma if self.architecture == "gemma3" else {}),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.qkv_bias,
            "max_position_embeddings": self.max_position_embeddings,
            **({"sliding_window": max(self.layer_windows), "use_sliding_window": True,
                "layer_types": ["sliding_attention" if w else "full_attention" for w in self.layer_windows]}
               if any(self.layer_windows) else {}),
        }  # fmt: skip


def hf_layer_windows(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Per-layer windows from an HF config: `layer_types` (Gemma 3, Qwen2/3) marks the windowed layers, else
    `sliding_window` applies to all (Mistral); Qwen2/3 use it only under `use_sliding_window`. () = none."""
    window = cfg.get("sliding_window")
    if cfg.get("model_type") in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    if not window:
        return ()
    if cfg.get("model_type") in ("gemma3", "gemma3_text") and not cfg.get("layer_types"):
        pattern = int(cfg.get("sliding_window_pattern", 6))  # older Gemma 3 configs: every pattern-th layer global
        return tuple(0 if (i + 1) % pattern == 0 else int(window) for i in range(layers))
    types = cfg.get("layer_types") or ["sliding_attention"] * layers
    if len(types) != layers:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {layers}")
    windows = tuple(int(window) if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()
