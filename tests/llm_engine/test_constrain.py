"""Constrained decoding: on a random-weight model (the hard case: it never wants JSON) every reply decoded under a
random schema's grammar parses and validates; the mask holds on every sampling path (prefill, batched decode, the
compiled step, a speculating engine); bad schemas are refused at submit."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from schemas import ESCAPED, random_schema, validate

from llm_engine.constrain import Constraint, GrammarError, json_schema_grammar
from llm_engine.engine import Engine
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams, TokenEvent


def _request(i: int, schema: dict[str, Any] | bool, temperature: float) -> GenerateRequest:
    sampling = SamplingParams(temperature=temperature, seed=i, max_new_tokens=600)
    constraint = Constraint(json_schema_grammar(schema))
    return GenerateRequest(f"s{i}", (ChatMessage("user", f"reply in JSON #{i}"),), sampling, constraint=constraint)


def _run(engine: Engine, reqs: list[GenerateRequest]) -> list[tuple[str, FinishEvent]]:
    streams = [engine.submit(r) for r in reqs]
    out = []
    for s in streams:
        _, text, last = s.collect()
        assert isinstance(last, FinishEvent), last
        out.append((text, last))
    return out


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer):
    return smol_tokenizer


@pytest.mark.parametrize("native", ["off", "on"])
def test_random_schemas_on_a_random_model_always_parse_and_validate(tiny_chat_model, tokenizer, native):
    """40 schemas, 8 slots decoding together (greedy and sampled), on the eager decode and on the compiled CPU
    step (native "on": the test fails where it cannot build), so the mask is shown to hold on both paths."""
    rng = random.Random(7 if native == "off" else 11)
    schemas = [random_schema(rng) for _ in range(40)]
    from llm_engine.fuse import fuse_projections

    model = tiny_chat_model(3)
    engine = Engine(fuse_projections(model) if native == "on" else model, tokenizer, max_slots=8, max_seq_len=1024,
                    native=native)  # fmt: skip
    assert engine.decode_path.startswith("compiled" if native == "on" else "torch"), engine.decode_path
    engine.start()
    try:
        results = _run(engine, [_request(i, s, 0.0 if i % 2 else 1.0) for i, s in enumerate(schemas)])
    finally:
        engine.stop()
    for schema, (text, fin) in zip(schemas, results):
        assert fin.reason == "stop", (fin.reason, text[:200], schema)  # the grammar ended the reply, not max_tokens
        validate(json.loads(text), schema)


def test_a_speculating_engine_masks_its_constrained_requests_too(tiny_chat_model, tokenizer):
    """An engine with a self-draft speculates for a request running alone: a constrained one must not."""
    from llm_engine.speculative import make_self_draft

    model = tiny_chat_model(5)
    engine = Engine(model, tokenizer, max_slots=2, max_seq_len=1024, draft=make_self_draft(model, scheme="int8"), native="off")
    engine.start()
    try:
        schemas = [random_schema(random.Random(i)) for i in range(4)]
        results = _run(engine, [_request(i, s, 0.0) for i, s in enumerate(schemas)])  # one at a time: each runs alone
    finally:
        engine.stop()
    for schema, (text, fin) in zip(schemas, results):
        assert fin.reason == "stop"
        validate(json.loads(text), schema)


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(tiny_chat_model, tokenizer):
    model = tiny_chat_model(4)
    plain = GenerateRequest("p", (ChatMessage("user", "hello"),), SamplingParams(max_new_tokens=20))
    alone = Engine(model, tokenizer, max_slots=2, max_seq_len=512, native="off")
    alone.start()
    try:
        [(want, _)] = _run(alone, [plain])
        both = _run(alone, [plain, _request(9, {"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": False}, 0.0)])
    finally:
        alone.stop()
    assert both[0][0] == want
    json.loads(both[1][0])


def test_a_trigger_leaves_text_free_then_constrains_what_follows(tiny_chat_model, tokenizer):
    """A grammar with a trigger (tool_choice auto): nothing is masked before it; the engine masks from the trigger."""
    from llm_engine.constrain import Guide

    guide = Guide(tokenizer, Constraint(json_schema_grammar({"type": "boolean"}), trigger="<call>"))
    logits = __import__("torch").zeros(tokenizer.vocab_size)
    assert guide.mask(logits).isfinite().all()
    for piece in ["hello ", "<ca", "ll>"]:
        for tid in tokenizer.encode(piece):
            guide.accept(tid, tokenizer.decode([tid]))
    allowed = guide.mask(logits).isfinite().nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).strip()[:1] in ("t", "f", "") for t in allowed)


def test_a_reply_that_begins_with_the_bare_start_is_constrained_from_its_first_character(tokenizer):
    """tool_choice auto's bare form: a reply that opens with the call's JSON is masked from there on (the call's
    arguments must fit the tool's schema); one that opens with words is free, and still waits for the marker."""
    import torch

    from llm_engine.constrain import Guide
    from llm_engine.tool_calls import call_constraint
    from llm_engine.tool_format import ToolSpec

    tools = [ToolSpec("calculate", parameters='{"type": "object", "properties": {"x": {"type": "integer"}}, '
                                              '"required": ["x"], "additionalProperties": false}')]  # fmt: skip
    logits = torch.zeros(tokenizer.vocab_size)

    def after(text: str) -> Guide:
        guide = Guide(tokenizer, call_constraint(tools, "auto"))
        for tid in tokenizer.encode(text):
            guide.accept(tid, tokenizer.decode([tid]))
        return guide

    bare = after('{"name": "calculate", "arguments": {"x": ')
    allowed = bare.mask(logits).isfinite().nonzero().flatten().tolist()
    assert bare.active and allowed and all(tokenizer.decode([t]).strip()[:1] in "-0123456789" for t in allowed)
    words = after('Sure, {"name": "calculate"')
    assert not words.active and words.mask(logits).isfinite().all()
    called = after("Sure. <tool_call>")
    assert called.active


@pytest.mark.parametrize("schema", [{"type": "bogus"}, {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}])
def test_a_schema_the_library_cannot_compile_is_refused_with_its_reason(schema):
    with pytest.raises(GrammarError) as err:
        json_schema_grammar(schema)
    assert str(err.value)


def test_tokens_and_text_agree_under_a_grammar(tiny_chat_model, tokenizer):
    engine = Engine(tiny_chat_model(6), tokenizer, max_slots=1, max_seq_len=512, native="off")
    stream = engine.submit(_request(2, {"type": "object", "properties": {"s": {"enum": ESCAPED}}, "required": ["s"], "additionalProperties": False}, 1.0))
    while engine.step() is not None:
        pass
    events = list(stream)
    ids = [e.token_id for e in events if isinstance(e, TokenEvent)]
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert tokenizer.decode(ids) == text and json.loads(text)["s"] in ESCAPED
