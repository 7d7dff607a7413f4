"""One-time conversion of a llama.cpp GGUF file into a cached Hugging Face-style folder.

Reads tensors with llm_engine.gguf_file, dequantizes them to float32, maps names, undoes llama.cpp's Q/K
row permutation, and saves config.json + model.safetensors + tokenizer files under the user cache dir.
Later loads read the safetensors (seconds). It knows nothing about the model code or the engine.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm_engine.config import ARCHITECTURES, ModelConfig, RopeScaling

CONVERTER_VERSION = 4  # bump when the conversion or the int8 layers a load keeps (loader.save_int8_layers) change

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 normalises each sublayer's output too; its `ffn_norm` is the norm before the MLP (Hugging Face's
# pre_feedforward_layernorm), `post_attention_norm` the attention output's
_GEMMA3_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def default_cache_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("parley")) / "gguf"


def cache_folder_for(gguf_path: Path, cache_root: Path | None = None, *, weights: bool = True) -> Path:
    key = f"{gguf_path.stem}-{fingerprint(gguf_path)}-v{CONVERTER_VERSION}" + ("" if weights else "-meta")
    return (cache_root or default_cache_root()) / key


def fingerprint(path: Path, samples: int = 64, chunk: int = 1 << 16) -> str:
    """The file's size and a hash of its first and last MiB and `samples` chunks spread between: the same file
    reinstalled (a new mtime) keeps its conversion, a changed one gets its own. A few milliseconds, any size."""
    size, mib = path.stat().st_size, 1 << 20
    reads = [(0, mib), *((i * size // samples, chunk) for i in range(1, samples)), (max(0, size - mib), mib)]
    h = hashlib.blake2b(str(size).encode(), digest_size=8)
    with path.open("rb") as f:
        for offset, n in reads:
            f.seek(offset)
            h.update(f.read(n))
    return f"{size}-{h.hexdigest()}"


def prepare_gguf(gguf_path: str | Path, cache_root: Path | None = None, *, progress: bool = True, weights: bool = True,
                 reader: Any = None) -> Path:
    """-> a folder with config.json, model.safetensors and tokenizer files; converts only the first time.

    weights=False: config and tokenizer only (a quantized load reads the weights from the GGUF itself).
    reader: the file's GgufFile, when the caller has parsed it already."""
    gguf_path = Path(gguf_path).resolve()
    folder = cache_folder_for(gguf_path, cache_root, weights=weights)
    if (folder / "done").exists():
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    convert_gguf(gguf_path, tmp, progress=progress, weights=weights, reader=reader)
    (tmp / "done").write_text("ok\n")
    shutil.rmtree(folder, ignore_errors=True)
    # A rename is atomic: a half-written conversion is never mistaken for a finished one.
    tmp.rename(folder)
    return folder


def convert_gguf(gguf_path: Path, out: Path, *, progress: bool = True, weights: bool = True, reader: Any = None) -> None:
    from safetensors.torch import save_file
    from tqdm import tqdm

    from llm_engine.gguf_file import GgufFile

    reader = reader or GgufFile(gguf_path)
    cfg = read_config(reader, gguf_path)
    if weights:
        state: dict[str, torch.Tensor] = {}
        bar = tqdm(reader.tensors, desc=f"converting {gguf_path.name} (once)", unit="tensor", disable=not progress)
        for t in bar:
            if t.name != ROPE_FREQS:  # read into the config (rope scaling), not a weight
                state[hf_name(t.name, cfg.architecture)] = dequantized(t, cfg)
        save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    names = {k: reader.fields.get(f"general.{k}") for k in ("name", "basename", "size_label")}
    (out / "model_name.json").write_text(json.dumps({k: v for k, v in names.items() if isinstance(v, str)}))  # families.py
    save_tokenizer(gguf_path, out, cfg.architecture)


def dequantized(t: Any, cfg: ModelConfig) -> torch.Tensor:
    """A GGUF tensor as float32 in Hugging Face's layout ([out, in] rows, llama's Q/K rows un-permuted)."""
    from gguf.quants import dequantize

    from llm_engine.gguf_blocks import wide_floats

    shape = [int(d) for d in reversed(t.shape)]  # GGUF lists dims innermost first
    w = wide_floats(t.tensor_type.name, t.data, shape[0], int(np.prod(shape[1:]))) if len(shape) == 2 else None
    if w is None:  # our unpacking reads Q5_0/Q8_0 faster than gguf's; gguf's is the reference (tests) and the rest
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)  # [rows=out, cols=in]
    w = w.reshape(shape)
    name = hf_name(t.name, cfg.architecture)
    if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
        w = unpermute_qk(w, cfg.num_heads)
    elif cfg.architecture == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
        w = unpermute_qk(w, cfg.num_kv_heads)
    return torch.from_numpy(np.array(w, copy=True))  # reader memory is read-only


ROPE_FREQS = "rope_freqs.weight"  # Llama 3.x: its rope scaling, as one divisor per rotary frequency
# The tensor types Parley reads (each tested against gguf's own dequantize); others are refused by name.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q6_K")


def read_config(reader: Any, gguf_path: Path) -> ModelConfig:
    """The model's shape from the GGUF metadata, with a one-line error for what Parley cannot run."""
    meta = {k: v for k, v in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    if "tokenizer.ggml.tokens" in reader.fields:
        meta["_n_vocab"] = len(reader.fields["tokenizer.ggml.tokens"])
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"{gguf_path.name}: tensor {t.name} is {t.tensor_type.name}; Parley reads "
                             f"{', '.join(SUPPORTED_TYPES)} (pick another quantization of this model)")  # fmt: skip
    freqs = tensors.get(ROPE_FREQS)
    factors = tuple(float(f) for f in np.asarray(freqs.data, dtype=np.float32).reshape(-1)) if freqs is not None else ()
    try:
        return config_from_gguf(meta, tied="output.weight" not in tensors, bias="blk.0.attn_q.bias" in tensors,
                                freq_factors=factors)  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"{gguf_path.name}: {exc}") from None


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA3_NAMES if arch == "gemma3" else _LAYER_NAMES
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if not m or m.group(2) not in names:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}"


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation (rotate-half rows -> interleaved pairs) for Q or K rows."""
    rows = w.shape[0]
    rest = w.shape[1:]
    # llama.cpp stored, per head, rows as [half=2][pair] -> [pair][2]; reverse the swap.
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(
    meta: dict[str, Any], *, tied: bool, bias: bool | None = None, freq_factors: tuple[float, ...] = ()
) -> ModelConfig:
    arch = str(meta["general.architecture"])
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}: Parley runs {', '.join(ARCHITECTURES)}")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    layers = int(get("block_count"))
    gemma = arch == "gemma3"
    windows: tuple[int, ...] = ()
    if gemma and get("attention.sliding_window"):
        # llama.cpp's Gemma 3: every sixth layer global, the others windowed (the file does not say; nor does it
        # carry the local rope base, 10,000, or the query scale, head_dim's except for the 27B, which we do not run)
        windows = tuple(0 if (i + 1) % 6 == 0 else int(get("attention.sliding_window")) for i in range(layers))
    scaling = RopeScaling()
    if freq_factors:
        scaling = RopeScaling(rope_type="freq_factors", freq_factors=freq_factors)
    elif get("rope.scaling.type") == "linear":
        scaling = RopeScaling(rope_type="linear", factor=float(get("rope.scaling.factor", 1.0)))
    elif get("rope.scaling.type") not in (None, "none"):
        raise ValueError(f"unsupported rope scaling {get('rope.scaling.type')!r}")
    return ModelConfig(
        vocab_size=int(get("vocab_size", 0)) or int(meta.get("_n_vocab", 0)),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", 0)) or hidden // heads,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings=tied,
        qkv_bias=arch == "qwen2" if bias is None else bias,
        qk_norm=arch in ("qwen3", "gemma3"),
        max_position_embeddings=int(get("context_length", 2048)),
        architecture=arch,
        layer_windows=windows,
        hidden_act="gelu_tanh" if gemma else "silu",
        rope_local_theta=10000.0 if gemma else 0.0,
    )


# Gemma's turn format, for Gemma 3 files that carry no template (llama.cpp's converter writes one only when the
# source had it; the 270M base does not): <start_of_turn>user|model, the turn, <end_of_turn>; no system role, so
# a system message opens the first user turn, a blank line before it.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% set system = '' %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] | trim ~ '\n\n' %}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}{% if m['role'] not in ('user', 'assistant') %}"
    "{{ raise_exception('Gemma turns are user or assistant, after one optional system message') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ system if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def save_tokenizer(gguf_path: Path, out: Path, arch: str = "llama") -> None:
    """transformers builds the tokenizer and chat template from the GGUF metadata; we keep its saved files.
    A Gemma 3 file without a template gets Gemma's turn format."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if arch == "gemma3" and not getattr(tok, "chat_template", None):
        tok.chat_template = GEMMA3_TEMPLATE
    tok.save_pretrained(str(out))
