"""A persona's system prompt stays in the prefix cache as a pinned prefix: a new session gets it copied in even when
the slot that computed it is busy and every other slot was given to someone else (a busy engine), and its reply is
token for token what a cold prefill gives. Engines stepped on the test's thread: what is busy when is exact."""
from __future__ import annotations

import pytest

from llm_engine.engine import ChatMessage, Engine, FinishEvent, GenerateRequest, SamplingParams, TokenEvent
from llm_engine.kv_cache import common_prefix_len
from llm_engine.prefix_pins import PrefixPins

PERSONA = ChatMessage("system", "You are Juniper, the voice of a small bakery in the old town. " * 8
                      + "Answer in one or two short sentences, warmly.")  # fmt: skip
OTHER = ChatMessage("system", "You are a ship's navigator. Speak only of stars and tides.")


def _engine(smol_engine, prefix_cache: bool = True) -> Engine:
    return Engine(smol_engine.model, smol_engine.tokenizer, max_slots=2, max_seq_len=1024,
                  kv_dtype=smol_engine.cache.k.dtype, prefix_cache=prefix_cache)  # fmt: skip


class Run:
    def __init__(self, engine: Engine, session: str, msgs: list[ChatMessage], max_new: int) -> None:
        self.ids: list[int] = []
        self.finish: FinishEvent | None = None
        self.stream = engine.submit(GenerateRequest(session, tuple(msgs), SamplingParams(max_new_tokens=max_new)), self._on)

    def _on(self, ev: object) -> None:
        if isinstance(ev, TokenEvent):
            self.ids.append(ev.token_id)
        elif isinstance(ev, FinishEvent):
            self.finish = ev


def _step_until(engine: Engine, done) -> None:
    for _ in range(400):
        if done():
            return
        engine.step()
    raise AssertionError("the engine did not get there")


def _busy_engine_then_a_newcomer(engine: Engine) -> Run:
    warm = Run(engine, "juniper-1", [PERSONA], 0)  # session 1's warm-up: the persona's prompt alone
    _step_until(engine, lambda: warm.finish is not None)
    talk = Run(engine, "juniper-1", [PERSONA, ChatMessage("user", "Tell me about your bread.")], 64)
    _step_until(engine, lambda: len(talk.ids) >= 1)
    talk.stream.hold(True)  # session 1 keeps its slot busy (its reply goes on later)
    other = Run(engine, "navigator", [OTHER, ChatMessage("user", "Hi")], 2)  # the other slot: another persona
    _step_until(engine, lambda: other.finish is not None)
    newcomer = Run(engine, "juniper-2", [PERSONA, ChatMessage("user", "Do you sell rye bread?")], 6)
    _step_until(engine, lambda: newcomer.finish is not None)  # it took the navigator's slot (its tokens gone)
    assert engine.slots.slots[engine.slots.slot_of("juniper-1")].busy  # the slot that computed the persona: busy
    talk.stream.cancel()
    _step_until(engine, lambda: talk.finish is not None)
    return newcomer


def test_a_new_session_gets_the_pinned_persona_prefix_while_its_holder_is_busy(smol_engine) -> None:
    engine = _engine(smol_engine)
    newcomer = _busy_engine_then_a_newcomer(engine)
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([PERSONA, ChatMessage("user", "Do you sell rye bread?")])
    persona = common_prefix_len(tok.apply_chat_template([PERSONA]), prompt)
    assert persona > 100
    assert newcomer.finish is not None and newcomer.finish.timings.shared_prefix_tokens == persona
    assert newcomer.finish.timings.prefill_tokens == len(prompt) - persona
    assert engine.pins.hits == 1 and len(engine.pins) == 1  # only a system prompt alone (a warm-up) is pinned
    cold = _busy_engine_then_a_newcomer(_engine(smol_engine, prefix_cache=False))
    assert cold.finish is not None and cold.finish.timings.shared_prefix_tokens == 0
    assert newcomer.ids == cold.ids and len(newcomer.ids) >= 3  # the copied keys and values are the computed ones


def test_pins_are_bounded_and_the_longest_shared_prefix_wins(smol_engine) -> None:
    engine = _engine(smol_engine)
    pins = PrefixPins(max_pins=2, max_tokens=100)
    a, b, c = list(range(100, 140)), list(range(200, 240)), list(range(300, 330))
    for tokens in (a, b, c):
        pins.pin(engine.cache, 0, tokens)
    assert len(pins) == 2 and pins.best(a + [1]) is None  # the oldest went (count bound)
    assert pins.best(b[:30] + [9, 9]) == (tuple(b), 30)
    assert pins.best(b[:10]) is None  # too short a share to be worth a copy
    pins.pin(engine.cache, 0, list(range(400, 480)))  # 80 more tokens: over 100 in all, so older ones go
    assert sum(len(k) for k in pins._pins) <= 100
