"""Builds our Transformer from a Hugging Face folder (config.json + safetensors, sharded or not) or a GGUF file.

It knows files, parameter names and dtypes; it knows nothing about caches, tokens or threads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from llm_engine.config import ModelConfig
from llm_engine.model import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors or of every shard named in model.safetensors.index.json."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(folder / name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def to_our_names(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, t in hf.items():
        if "rotary_emb" in key:
            continue  # we compute rope tables ourselves
        out[key.removeprefix("model.")] = t
    return out


def build_model(
    cfg: ModelConfig, state: dict[str, torch.Tensor], *, max_seq_len: int, dtype: torch.dtype, device: str,
    supplied: frozenset[str] = frozenset(),
) -> Transformer:
    """Build on the meta device and adopt the loaded tensors, so weights are never allocated twice.

    supplied: parameters that stay on the meta device because a ready quantized layer will replace their
    module (quantize_model's replacements)."""
    with torch.device("meta"):
        model = Transformer(cfg, max_seq_len)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: v.to(device=device, dtype=dtype) for k, v in fold_norms(cfg, state).items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k not in supplied]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.set_rope(device)  # the rope tables are non-persistent buffers still on meta: built for real, in float32
    return model.eval().requires_grad_(False)


def fold_norms(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gemma 3's norms in the plain `weight * x` form our RMSNorm computes: norm_weight_offset added to every norm
    weight (a checkpoint's w for (1 + w)), and the query norm scaled by sqrt(head_dim / query_pre_attn_scalar), so
    the attention's usual head_dim ** -0.5 gives query_pre_attn_scalar ** -0.5 (rope is linear). In float32."""
    q_scale = (cfg.head_dim / cfg.query_pre_attn_scalar) ** 0.5 if cfg.query_pre_attn_scalar else 1.0
    if not cfg.norm_weight_offset and q_scale == 1.0:
        return state
    out = dict(state)
    for key, t in state.items():
        if key.endswith("norm.weight"):
            w = t.float() + cfg.norm_weight_offset
            out[key] = w * q_scale if key.endswith("q_norm.weight") else w
    return out


def load_hf_folder(folder: Path, *, max_seq_len: int, dtype: torch.dtype, device: str) -> Transformer:
    cfg = ModelConfig.from_json_file(folder / "config.json")
    return build_model(cfg, to_our_names(read_safetensors(folder)), max_seq_len=max_seq_len, dtype=dtype, device=device)


def load_gguf_quantized(
    path: Path, scheme: str, *, max_seq_len: int, dtype: str = "float32", device: str = "cpu"
) -> tuple[Transformer, Path, dict[str, torch.nn.Module]]:
    """A GGUF read once for a quantized model: -> (the model, with meta weights where a layer is taken as stored,
    the folder with its config and tokenizer, those layers for quantize_model). No float copy of what the
    layers hold: the other tensors (embedding, norms, layers the scheme requantizes) are dequantized on the
    first load and kept beside the config, so later loads only unpack the blocks."""
    from safetensors.torch import load_file, save_file

    from llm_engine.gguf_file import GgufFile
    from llm_engine.gguf_loader import prepare_gguf
    from llm_engine.gguf_quant import read_gguf

    reader = GgufFile(path)  # parsed once, for its config and tokenizer (the first load) and its weights
    folder = prepare_gguf(path, weights=False, reader=reader)
    rest = folder / f"rest-{scheme}.safetensors"
    made = folder / int8_cache_name(scheme)
    int8 = load_file(str(made)) if made.exists() else None
    weights = read_gguf(path, scheme, floats=not rest.exists(), reader=reader, int8=int8)  # type: ignore[arg-type]
    if rest.exists():
        # not the float copy of a head the int8 layers already hold (the 0.5B's: 545 MB read for nothing each start)
        with safe_open(str(rest), framework="pt") as f:
            weights.floats = {k: f.get_tensor(k) for k in f.keys() if not (k == "lm_head.weight" and "lm_head" in weights.layers)}
    else:
        tmp = rest.with_suffix(".tmp")
        save_file(weights.floats, str(tmp))
        tmp.rename(rest)  # atomic: a half-written file is never read
    state = {k.removeprefix("model."): v for k, v in weights.floats.items()}
    supplied = frozenset(f"{p}.weight" for p in weights.layers)
    model = build_model(weights.cfg, state, max_seq_len=max_seq_len, dtype=resolve_dtype(dtype), device=device, supplied=supplied)
    return model, folder, weights.layers


def int8_cache_name(scheme: str) -> str:
    """The file beside a GGUF's converted config that keeps the int8 layers a load made under `scheme` (the file's
    wider projections and the head, requantized per channel: ~70 % of the 0.5B's load), so later loads read them."""
    return f"int8-{scheme}.safetensors"


def save_int8_layers(model: Transformer, folder: Path, scheme: str) -> None:
    """After the first quantized load (before fusion): every int8 layer's codes and scales, by module path, once."""
    from safetensors.torch import save_file

    from llm_engine.quantize import Int8WeightOnlyLinear

    out = folder / int8_cache_name(scheme)
    if out.exists():
        return
    layers = {path: m for path, m in model.named_modules() if isinstance(m, Int8WeightOnlyLinear)}
    tensors = {f"{p}.{k}": getattr(m, k).contiguous() for p, m in layers.items() for k in ("qweight", "scales")}
    tmp = out.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.rename(out)  # atomic: a half-written file is never read


def load_model(path: str | Path, *, max_seq_len: int, dtype: str = "float32", device: str = "cpu") -> tuple[Transformer, Path]:
    """-> (model, folder holding config.json and tokenizer files). A .gguf goes through the converted cache."""
    path = Path(path)
    if path.suffix == ".gguf":
        from llm_engine.gguf_loader import prepare_gguf

        path = prepare_gguf(path)
    return load_hf_folder(path, max_seq_len=max_seq_len, dtype=resolve_dtype(dtype), device=device), path
