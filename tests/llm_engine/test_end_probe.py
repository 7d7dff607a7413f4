"""The end-of-turn probe: P(the user's message is complete) read from the prompt's own prefill forward."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import corpus
from llm_engine.engine import Engine
from llm_engine.kv_cache import StaticKVCache
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams

SYSTEM = ChatMessage("system", "You are a friendly voice assistant. Answer briefly.")


def probe(engine: Engine, session: str, text: str, history: tuple[ChatMessage, ...] = ()) -> object:
    req = GenerateRequest(session, (SYSTEM, *history, ChatMessage("user", text)), SamplingParams(max_new_tokens=0),
                          probe_user_end=True)  # fmt: skip
    return engine.submit(req).collect()[2]


def test_probe_position_is_the_last_word_whatever_the_punctuation(smol_tokenizer) -> None:
    tok = smol_tokenizer
    for text, last_word in [("Can you tell me the capital of", " of"), ("Capital of Australia?", " Australia"),
                            ("I would like to book a table, ", " table"), ("Thanks!!", "Thanks")]:  # fmt: skip
        msgs = [SYSTEM, ChatMessage("user", text)]
        ids = tok.apply_chat_template(msgs)
        k, end_ids = tok.user_end_probe(msgs, ids)
        assert tok.decode([ids[k]]) == last_word
        im_end = tok.hf.convert_tokens_to_ids("<|im_end|>")
        assert im_end in end_ids and ids[k + 1 :].count(im_end) == 1  # the template's end of the user turn
        others = {tok.decode([i]).strip() for i in end_ids - {im_end}}
        assert {".", "?", "!"} <= others and all(piece and set(piece) <= set(".?!…") for piece in others)
        assert tok.hf.convert_tokens_to_ids(",") not in end_ids
    # nothing to probe: no words, or the last message is not the user's
    assert tok.user_end_probe([SYSTEM, ChatMessage("user", "?!")], tok.apply_chat_template([SYSTEM, ChatMessage("user", "?!")])) is None
    msgs = [SYSTEM, ChatMessage("user", "hi"), ChatMessage("assistant", "Hello.")]
    assert tok.user_end_probe(msgs, tok.apply_chat_template(msgs)) is None


def test_end_prob_is_the_softmax_mass_of_the_end_tokens_at_the_last_word(smol_tokenizer, tiny_chat_model) -> None:
    model = tiny_chat_model(3)
    engine = Engine(model, smol_tokenizer, max_slots=2, max_seq_len=256)
    msgs = [SYSTEM, ChatMessage("user", "How long does it take to boil an egg?")]
    ids = smol_tokenizer.apply_chat_template(msgs)
    k, end_ids = smol_tokenizer.user_end_probe(msgs, ids)
    cache = StaticKVCache(2, 1, 2, 256, 16)
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, [0], "all")[0]  # [T, V]
    expected = float(torch.softmax(logits[k], -1)[sorted(end_ids)].sum())
    stream = engine.submit(GenerateRequest("a", tuple(msgs), SamplingParams(max_new_tokens=0), probe_user_end=True))
    while engine.step() is not None:
        pass
    fin = stream.collect()[2]
    assert fin.end_prob == pytest.approx(expected, rel=1e-5)
    # the same prompt again: its prefix is cached, yet the probed position runs through the model once more
    stream = engine.submit(GenerateRequest("a", tuple(msgs), SamplingParams(max_new_tokens=0), probe_user_end=True))
    while engine.step() is not None:
        pass
    again = stream.collect()[2]
    assert again.end_prob == pytest.approx(expected, rel=1e-5)
    assert again.timings.reused_tokens == k and again.timings.prefill_tokens == len(ids) - k
    # without the probe a request reports none and reuses everything but the last token
    stream = engine.submit(GenerateRequest("a", tuple(msgs), SamplingParams(max_new_tokens=0)))
    while engine.step() is not None:
        pass
    plain = stream.collect()[2]
    assert plain.end_prob is None and plain.timings.reused_tokens == len(ids) - 1


def test_probe_in_a_later_prefill_chunk_and_a_reply_after_it(smol_tokenizer, tiny_chat_model) -> None:
    """A long history puts the probed row in the last of several prompt chunks; the reply that follows the probe
    with the same messages reuses the whole prompt and samples what a cold request samples."""
    model = tiny_chat_model(4)
    engine = Engine(model, smol_tokenizer, max_slots=2, max_seq_len=512, prefill_chunk=16)
    history = tuple(ChatMessage(r, f"message number {i} about the weather and the sea") for i, r in
                    zip(range(6), ["user", "assistant"] * 3))  # fmt: skip
    msgs = (SYSTEM, *history, ChatMessage("user", "And tomorrow?"))
    ids = smol_tokenizer.apply_chat_template(list(msgs))
    k, end_ids = smol_tokenizer.user_end_probe(list(msgs), ids)
    assert k > 64
    cache = StaticKVCache(2, 1, 2, 512, 16)
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, [0], "all")[0]
    expected = float(torch.softmax(logits[k], -1)[sorted(end_ids)].sum())

    def run(session: str, max_new: int, probe_end: bool):
        stream = engine.submit(GenerateRequest(session, msgs, SamplingParams(max_new_tokens=max_new), probe_user_end=probe_end))
        while engine.step() is not None:
            pass
        return stream.collect()

    _, _, fin = run("a", 0, True)
    assert fin.end_prob == pytest.approx(expected, rel=1e-4)
    warm_ids, _, warm = run("a", 8, False)
    cold_ids, _, _ = run("b", 8, False)
    assert warm.timings.reused_tokens == len(ids) - 1 and warm_ids == cold_ids


@pytest.mark.slow
def test_embedded_model_hears_a_fragment_and_a_complete_question_apart(smol_engine) -> None:
    """The signal the turn detector uses, on the real model: a half sentence is all but impossible to end,
    its completion likely to, with or without the recogniser's punctuation."""
    fragment = probe(smol_engine, "p1", "Can you tell me the capital of")
    fragment_period = probe(smol_engine, "p1", "Can you tell me the capital of.")
    whole = probe(smol_engine, "p1", "Can you tell me the capital of Australia?")
    whole_bare = probe(smol_engine, "p1", "Can you tell me the capital of Australia")
    assert fragment.end_prob < 1e-2 and fragment_period.end_prob == pytest.approx(fragment.end_prob, rel=1e-3)
    assert whole.end_prob > 0.5 and whole_bare.end_prob == pytest.approx(whole.end_prob, rel=1e-3)
    smol_engine.release("p1")


@pytest.mark.slow
def test_embedded_model_over_the_bench_corpus_hears_halves_as_unfinished_and_wholes_as_finished(smol_engine) -> None:
    """The text signal over bench/corpus.py: each paused request's first half (as the pause cuts it), each paused
    request whole, and every plain request. Measured here (2-core x86 with AVX-512): halves below even odds 18 of 18
    (the highest 0.35, "Remind me to call my mother"); wholes above 22 of 40 (the signal is weak on whole requests,
    which is why the detector combines it with the audio model and waits between its two thresholds); every whole
    paused request above its own first half 18 of 18. The pass marks allow one borderline case either way per count,
    for the few 1e-3 that another CPU's kernels move a probability."""
    halves = [probe(smol_engine, "corpus", first).end_prob for first, _ in corpus.PAUSED_REQUESTS]
    paused_wholes = [probe(smol_engine, "corpus", f"{first} {second}").end_prob for first, second in corpus.PAUSED_REQUESTS]
    wholes = paused_wholes + [probe(smol_engine, "corpus", r).end_prob for r in corpus.REQUESTS]
    smol_engine.release("corpus")
    below = sum(p < 0.5 for p in halves)
    above = sum(p > 0.5 for p in wholes)
    apart = sum(w > h for h, w in zip(halves, paused_wholes))
    print(f"\nhalves below even odds {below}/{len(halves)}, wholes above {above}/{len(wholes)}, "
          f"whole above its half {apart}/{len(halves)}")  # fmt: skip
    shown = (np.round(halves, 3), np.round(wholes, 3))
    assert len(halves) == 18 and len(wholes) == 40  # the corpus the marks were measured on
    assert below >= 17, shown
    assert above >= 21, shown
    assert apart >= 17, shown
    assert float(np.median(halves)) < 0.05 < float(np.median(wholes)), shown
