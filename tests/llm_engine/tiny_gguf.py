"""Tiny random models of each family, as Hugging Face folders and as GGUF files written by `gguf`'s own writer.

A GGUF here is written the way llama.cpp's converter writes one: llama's Q/K rows permuted, Llama 3's rope
scaling as a `rope_freqs` tensor, 1-D tensors in F32 and every matrix in the type asked for, the tokenizer
(the embedded SmolLM2 vocabulary's first 1,024 ids, plus the family's chat-template tokens) and the family's chat template in
the metadata. K-quant blocks are random bytes with small scales (gguf-py writes no K-quants): what matters is
that both sides read the same file.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

# hidden and intermediate are multiples of 256, the K-quant super-block
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES = ("llama3", "qwen2", "qwen3")
TOKENIZER_SIZE = 1024  # SmolLM2's first ids: specials, bytes, the commonest merges (tokenizer_for)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}  # fmt: skip

_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}  # fmt: skip
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}  # fmt: skip
# K-quant block layouts: bytes per 256 weights, {byte offset of a float16 scale field: its value}. Q4_K and Q5_K
# subtract dmin * min from d * scale * q: dmin is set so that the two cancel on average (zero-mean weights).
_K_BLOCKS = {"Q4_K": (144, {0: 4e-4, 2: 3e-3}), "Q5_K": (176, {0: 2e-4, 2: 3.1e-3}), "Q6_K": (210, {208: 1e-4})}


def tokenizer_for(family: str, smol_folder: Path, size: int = TOKENIZER_SIZE):
    """The embedded SmolLM2 tokenizer cut to its first `size` ids, with the family's chat template (and Llama 3's
    header tokens)."""
    tok = _first_ids(smol_folder, size)
    if family == "llama3":
        tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS, "bos_token": "<|begin_of_text|>",
                                "eos_token": "<|eot_id|>"})  # fmt: skip
        tok.chat_template = LLAMA3_TEMPLATE
    else:
        tok.chat_template = QWEN_TEMPLATE
        tok.add_special_tokens({"eos_token": "<|im_end|>"})
    return tok


def _first_ids(smol_folder: Path, size: int):
    """SmolLM2's byte-level BPE cut to ids below `size`: its special tokens, the 256 bytes and the first merges
    (a merge stays when both parts and its result do), so every text still encodes. The full 49,152-token
    vocabulary made each GGUF's metadata ~1.5 million fields, which gguf's reader and transformers' GGUF
    tokenizer took ~6 s apiece to read."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    data = json.loads((smol_folder / "tokenizer.json").read_text())
    vocab = {piece: i for piece, i in data["model"]["vocab"].items() if i < size}
    data["model"]["vocab"] = vocab
    data["model"]["merges"] = [m for m in data["model"]["merges"]
                               if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]  # fmt: skip
    data["added_tokens"] = [a for a in data["added_tokens"] if a["id"] < size]
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if (smol_folder / name).exists():
                shutil.copy(smol_folder / name, tmp)
        (Path(tmp) / "tokenizer.json").write_text(json.dumps(data))
        return AutoTokenizer.from_pretrained(tmp)


def build_hf(family: str, folder: Path, tok, *, tied: bool = False, seed: int = 0) -> Path:
    """A random model of `family` saved by transformers with `tok`, weights spread wide (std 0.08 for matrices,
    norms and biases too) so greedy choices are not near-ties; logits of a few units, so 1e-4 is float32 rounding, not luck)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(SHAPE, vocab_size=len(tok), initializer_range=0.08, tie_word_embeddings=tied,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    if family == "llama3":
        cfg = LlamaConfig(**common, rope_scaling=LLAMA3_ROPE)
    elif family == "qwen2":
        cfg = Qwen2Config(**common)
    elif family == "qwen3":
        cfg = Qwen3Config(**common, head_dim=128)  # wider than hidden / heads, as Qwen3's own are
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF q/k rows of a llama model (rotate-half -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_freq_factors(head_dim: int, rope: dict) -> np.ndarray:
    """Llama 3 scaling as llama.cpp's converter bakes it into `rope_freqs`: one divisor per frequency."""
    factor, lo, hi, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / head_dim)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def random_k_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks [rows, cols/256*bytes] uint8 whose float16 scale fields hold small values."""
    size, fields = _K_BLOCKS[kind]
    raw = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    for at, value in fields.items():
        raw[..., at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def write_gguf(hf_folder: Path, out: Path, family: str, qtype: str = "F32", *, seed: int = 0) -> Path:
    """The model in `hf_folder` as a GGUF: every matrix in `qtype`, 1-D tensors F32."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_folder / "tokenizer_config.json").read_text())
    arch = "llama" if family == "llama3" else family
    w = gguf.GGUFWriter(str(out), arch)
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_vocab_size(cfg["vocab_size"])
    template = hf_folder / "chat_template.jinja"  # transformers 5 keeps the template beside the config
    _add_tokenizer(w, tok, tok_cfg, cfg, template.read_text() if template.exists() else tok_cfg["chat_template"])

    state = load_file(str(hf_folder / "model.safetensors"))
    rng = np.random.default_rng(seed)
    if family == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_freq_factors(head_dim, rope))
    for name, t in state.items():
        a = t.float().numpy()
        if name in _GLOBAL:
            gname = _GLOBAL[name]
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{layer}.{_TO_GGUF[rest]}"
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_q.bias")):
            a = llama_cpp_permute(a, heads)
        elif arch == "llama" and gname.endswith(("attn_k.weight", "attn_k.bias")):
            a = llama_cpp_permute(a, kv)
        _add(w, gname, np.ascontiguousarray(a), qtype if a.ndim == 2 else "F32", rng)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add(w, name: str, a: np.ndarray, qtype: str, rng: np.random.Generator) -> None:
    import gguf
    from gguf.quants import quantize

    t = gguf.GGMLQuantizationType[qtype]
    if qtype == "F32":
        w.add_tensor(name, a.astype(np.float32))
    elif qtype == "F16":
        w.add_tensor(name, a.astype(np.float16))
    elif qtype in _K_BLOCKS:
        w.add_tensor(name, random_k_blocks(qtype, a.shape[0], a.shape[1], rng), raw_dtype=t)
    else:  # BF16, Q8_0, Q4_0, Q4_1: gguf's own quantizer
        w.add_tensor(name, quantize(a, t), raw_dtype=t)


def _add_tokenizer(w, tok: dict, tok_cfg: dict, cfg: dict, template: str) -> None:
    import gguf

    vocab = dict(tok["model"]["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    specials = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    tokens = [""] * cfg["vocab_size"]
    for piece, i in vocab.items():
        tokens[i] = piece
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))])
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(vocab[tok_cfg["bos_token"]] if isinstance(tok_cfg.get("bos_token"), str) else cfg["bos_token_id"])
    w.add_eos_token_id(vocab[tok_cfg["eos_token"]] if isinstance(tok_cfg.get("eos_token"), str) else cfg["eos_token_id"])
    w.add_chat_template(template)
