"""Tokenizer on the embedded SmolLM2: chat template, stop tokens, streaming detokenization, stop strings."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_engine.gguf_loader import prepare_gguf
from llm_engine.tokenizer import ChatMessage, StopStringFilter, Tokenizer


@pytest.fixture(scope="module")
def tok(smol_path) -> Tokenizer:
    return Tokenizer.from_folder(prepare_gguf(smol_path))


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    d = tok.detokenizer()
    deltas = [d.push(i) for i in ids]
    return deltas + [d.flush()]


def test_from_folder_loads_the_class_autotokenizer_would(smol_path, tmp_path):
    """The generic fast tokenizer is loaded directly (no model registry); a folder naming a model's own tokenizer
    class still gets that class from AutoTokenizer. Either way the same ids as AutoTokenizer's."""
    import json
    import shutil

    from transformers import AutoTokenizer

    folder = prepare_gguf(smol_path)
    named = tmp_path / "named"
    shutil.copytree(folder, named)
    config = json.loads((named / "tokenizer_config.json").read_text())
    (named / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    text = "Hello, world! What's 2+2? Ünïcödé… <|im_end|>"
    for path in (folder, named):
        ours, auto = Tokenizer.from_folder(path), AutoTokenizer.from_pretrained(str(path))
        assert type(ours.hf) is type(auto), path
        assert ours.encode(text) == auto.encode(text, add_special_tokens=False)
    assert type(Tokenizer.from_folder(named).hf) is not type(Tokenizer.from_folder(folder).hf)


def test_chat_template_places_persona_history_and_generation_prompt(tok):
    msgs = [
        ChatMessage("system", "You are Pat, a pirate."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Ahoy!"),
        ChatMessage("user", "Where to?"),
    ]
    text = tok.render_chat(msgs)
    assert text == (
        "<|im_start|>system\nYou are Pat, a pirate.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nAhoy!<|im_end|>\n<|im_start|>user\nWhere to?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(msgs)
    assert ids[0] == tok.hf.convert_tokens_to_ids("<|im_start|>")  # specials are single tokens, no extra bos
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.hf.convert_tokens_to_ids("<|im_end|>") in tok.stop_ids


@pytest.mark.parametrize(
    "text",
    [
        "Hello,  world!  Two  spaces   and three.",
        "Café, naïve, Zürich — “quotes” and ‘more’.",
        "Emoji: 🎉🙂👍🏽 and a family 👨‍👩‍👧 done.",
        "中文和日本語のテキスト, 한국어.",
        "Line one\n\n  indented line\ttab\n",
        " leading space and trailing ",
    ],
)
def test_stream_deltas_concatenate_to_the_full_decode(tok, text):
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)  # never a broken character on the way


def test_multibyte_character_is_held_until_complete(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1  # byte-level BPE splits it
    deltas = stream(tok, ids)
    assert deltas[:-2] == [""] * (len(ids) - 1) and "".join(deltas) == "🎉"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=list("ab  cé\n🙂中.,'"), max_size=40))
def test_stream_is_lossless_for_any_text(tok, text):
    ids = tok.encode(text)
    assert "".join(stream(tok, ids)) == tok.decode(ids)


def test_stop_string_split_across_deltas_is_cut_and_never_emitted():
    f = StopStringFilter(["</s>", "User:"])
    out = []
    for piece in ["Hello", " Us", "e", "r and <", "/", "s> tail"]:
        text, stopped = f.feed(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "Hello User and "
    assert stopped


def test_stop_string_prefix_that_does_not_complete_is_released():
    f = StopStringFilter(["User:"])
    assert f.feed("Hi Us") == ("Hi ", False)
    assert f.feed("ually") == ("Usually", False)
    assert f.feed(" Use") == (" ", False)
    assert f.flush() == "Use"
