"""The engine speculates for a request running alone: greedy output unchanged, the draft caught up after batched steps.

An unstarted Engine is driven step by step on a tiny random model (embedded tokenizer) with an int8 self-draft.
"""
from __future__ import annotations

import pytest

from llm_engine.engine import Engine
from llm_engine.model import Transformer
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams, TokenEvent
from llm_engine.speculative import make_self_draft
from llm_engine.tokenizer import Tokenizer

SYSTEM = ChatMessage("system", "You are terse.")


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer) -> Tokenizer:
    return smol_tokenizer


@pytest.fixture(scope="module")
def tiny(tiny_chat_model) -> Transformer:
    return tiny_chat_model(1, 512)


def req(session: str, text: str, **sampling) -> GenerateRequest:
    return GenerateRequest(session, (SYSTEM, ChatMessage("user", text)), SamplingParams(**sampling))


def drive(engine: Engine, streams: list, limit: int = 1000) -> list[tuple[list[int], str]]:
    while not all(_finished(s) for s in streams):
        assert engine.step() is not None
        limit -= 1
        assert limit > 0
    out = []
    for s in streams:
        ids, _, fin = s.collect()
        out.append((ids, fin.reason))
    return out


def _finished(stream) -> bool:
    return any(isinstance(e, FinishEvent) for e in list(stream._events.queue))


def solo(tiny, tokenizer, r: GenerateRequest) -> tuple[list[int], str]:
    engine = Engine(tiny, tokenizer, max_slots=1, max_seq_len=512)
    return drive(engine, [engine.submit(r)])[0]


def test_greedy_alone_is_unchanged_and_takes_fewer_target_forwards(tiny, tokenizer):
    r = req("a", "Name a fruit.", max_new_tokens=40)
    want = solo(tiny, tokenizer, r)
    engine = Engine(tiny, tokenizer, max_slots=2, max_seq_len=512, draft=make_self_draft(tiny, scheme="int8"))
    assert drive(engine, [engine.submit(r)])[0] == want
    stats = engine.speculation.decoder.stats
    assert want[1] == "length" and stats.accepted > 0
    assert stats.emitted >= len(want[0]) - 1  # the last step may emit past max_new_tokens: those are dropped
    assert engine.steps == 1 + stats.steps < len(want[0]) // 2  # the prompt, then several tokens per target forward


def test_draft_catches_up_after_batched_steps_and_across_turns(tiny, tokenizer, monkeypatch):
    long_req = req("x", "Tell me a long story.", max_new_tokens=60)
    short_req = req("y", "Say hi.", max_new_tokens=8)
    sampled = req("z", "Pick a number.", max_new_tokens=7, temperature=0.9, seed=4)
    want_x, want_y = solo(tiny, tokenizer, long_req), solo(tiny, tokenizer, short_req)
    engine = Engine(tiny, tokenizer, max_slots=3, max_seq_len=512, draft=make_self_draft(tiny, scheme="int8"))
    feeds: list[tuple[int, int, int]] = []  # (slot, tokens fed, start position) per draft catch-up
    real = engine.speculation.decoder.prefill_draft
    monkeypatch.setattr(engine.speculation.decoder, "prefill_draft",
                        lambda slot, tokens, start=0: (feeds.append((slot, len(tokens), start)), real(slot, tokens, start))[1])  # fmt: skip

    sx = engine.submit(long_req)
    tokens_x = lambda: sum(isinstance(e, TokenEvent) for e in list(sx._events.queue))  # noqa: E731
    while tokens_x() < 6:
        engine.step()
    prompt_x = len(tokenizer.apply_chat_template(long_req.messages))
    assert feeds == [(0, prompt_x, 0)]  # the whole prompt once, before the first speculative step
    sy, sz = engine.submit(short_req), engine.submit(sampled)
    (got_y, _), (got_z, reason_z) = drive(engine, [sy, sz])  # x decodes in the batch meanwhile, without its draft
    assert got_y == want_y[0]
    assert len(got_z) == 7 and reason_z == "length"  # exactly max_new_tokens, though a step may emit several
    assert drive(engine, [sx])[0] == want_x  # greedy output as if never speculated nor batched
    x_feeds = [f for f in feeds if f[0] == 0]
    assert len(x_feeds) == 2
    _, fed, start = x_feeds[1]
    assert start > prompt_x and fed <= 30  # only what x decoded in the batch, not its whole history

    # Next turn of x's session: its draft reuses the cached conversation, only the new turn goes through it.
    turn2 = GenerateRequest("x", long_req.messages + (ChatMessage("assistant", "Once."), ChatMessage("user", "More.")),
                            SamplingParams(max_new_tokens=5))  # fmt: skip
    drive(engine, [engine.submit(turn2)])
    slot, fed, start = feeds[-1]
    assert slot == 0 and start >= prompt_x - 1 and fed < 20
