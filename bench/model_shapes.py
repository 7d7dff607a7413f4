"""Random-weight GGUFs at the shapes of models people download, written with `gguf`'s own writer.

Decode speed depends on a model's shape and tensor types, not on its weights, so these stand in for the real
files (which cannot be downloaded here). Blocks are random bytes with small float16 scales (zero-mean weights);
the tokenizer is the embedded SmolLM2 vocabulary padded with control tokens to the model's vocabulary size,
so the head is as large as the real one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF general.architecture
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    bias: bool  # Qwen2's q/k/v biases

    def params(self) -> int:
        d = self.hidden // self.heads
        attn = self.hidden * d * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.inter) + self.vocab * self.hidden * (1 if self.tied else 2)


SHAPES = {
    # Qwen2.5-0.5B-Instruct's config.json
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, tied=True, bias=True),
    # a 1.5B Llama: Llama-3.2-1B's config.json with an untied head (every dimension a multiple of 256, as K-quants need)
    "llama-1.5b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, tied=False, bias=False),
}
# bytes per block, weights per block, {byte offset of a float16 field: its value}
_BLOCKS = {
    "Q4_1": (20, 32, {0: 2e-3, 2: -1.5e-2}),
    "Q4_0": (18, 32, {0: 2e-3}),
    "Q8_0": (34, 32, {0: 2e-4}),
    "Q4_K": (144, 256, {0: 4e-4, 2: 3e-3}),
    "Q6_K": (210, 256, {208: 1e-4}),
}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    size, per, fields = _BLOCKS[qtype]
    if cols % per:
        raise ValueError(f"{qtype} needs rows of a multiple of {per} weights, this one has {cols}")
    raw = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    for at, value in fields.items():
        raw[..., at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def write(name: str, qtype: str, out: Path, smol_tokenizer_folder: Path, *, seed: int = 0) -> Path:
    """The GGUF for SHAPES[name] with every matrix in `qtype` (norms and biases F32); kept if it exists."""
    import gguf

    if out.exists():
        return out
    s = SHAPES[name]
    rng = np.random.default_rng(seed)
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), s.arch)
    d = s.hidden // s.heads
    w.add_context_length(4096)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.inter)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6 if s.arch == "qwen2" else 1e4)
    w.add_vocab_size(s.vocab)
    _tokenizer(w, smol_tokenizer_folder, s.vocab)

    def matrix(tname: str, rows: int, cols: int) -> None:
        t = gguf.GGMLQuantizationType[qtype]
        w.add_tensor(tname, random_blocks(qtype, rows, cols, rng), raw_dtype=t)

    def vector(tname: str, n: int, mean: float) -> None:
        w.add_tensor(tname, rng.normal(mean, 0.05, n).astype(np.float32))

    matrix("token_embd.weight", s.vocab, s.hidden)
    vector("output_norm.weight", s.hidden, 1.0)
    if not s.tied:
        matrix("output.weight", s.vocab, s.hidden)
    for i in range(s.layers):
        b = f"blk.{i}"
        vector(f"{b}.attn_norm.weight", s.hidden, 1.0)
        vector(f"{b}.ffn_norm.weight", s.hidden, 1.0)
        for proj, rows in (("attn_q", s.heads * d), ("attn_k", s.kv_heads * d), ("attn_v", s.kv_heads * d)):
            matrix(f"{b}.{proj}.weight", rows, s.hidden)
            if s.bias:
                vector(f"{b}.{proj}.bias", rows, 0.0)
        matrix(f"{b}.attn_output.weight", s.hidden, s.heads * d)
        matrix(f"{b}.ffn_gate.weight", s.inter, s.hidden)
        matrix(f"{b}.ffn_up.weight", s.inter, s.hidden)
        matrix(f"{b}.ffn_down.weight", s.hidden, s.inter)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def _tokenizer(w, folder: Path, vocab_size: int) -> None:
    import gguf

    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    specials = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    tokens = [f"<|extra_{i}|>" for i in range(vocab_size)]
    for piece, i in vocab.items():
        tokens[i] = piece
    types = [gguf.TokenType.CONTROL if i in specials or i >= len(vocab) else gguf.TokenType.NORMAL for i in range(vocab_size)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
