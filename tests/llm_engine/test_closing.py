"""Structured output closes at the token limit: the walk to the nearest accepting state (llm_engine/closing.py) from
any point of any schema's grammar; a random model (it never wants to stop) and the embedded SmolLM2 at tight
max_tokens still write JSON that parses and validates, with finish reason "length"; requests that do not ask to
close are cut as before."""
from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from schemas import random_object, random_schema, unbounded, validate

from llm_engine.closing import Quote, closing_path, vocabulary
from llm_engine.constrain import CLOSE_WINDOW_TOKENS, Constraint, _lib, _ll_tokenizer, json_schema_grammar
from llm_engine.engine import Engine
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams

S = {"type": "string"}
FRUITS = {"type": "object", "properties": {"fruits": {"type": "array", "items": S}}, "required": ["fruits"],
          "additionalProperties": False}  # fmt: skip
PERSON = {"type": "object", "properties": {"name": S, "hobbies": {"type": "array", "items": S},
          "address": {"type": "object", "properties": {"city": S, "country": S}, "required": ["city", "country"],
                      "additionalProperties": False}},
          "required": ["name", "hobbies", "address"], "additionalProperties": False}  # fmt: skip
BOOKS = {"type": "object", "properties": {"books": {"type": "array", "items": {"type": "object",
         "properties": {"title": S, "author": S}, "required": ["title", "author"], "additionalProperties": False}}},
         "required": ["books"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def vocab(smol_tokenizer):
    return vocabulary(smol_tokenizer, _ll_tokenizer(smol_tokenizer))


def _matcher(tokenizer, schema: dict[str, Any], text: str = "") -> tuple[Any, Quote]:
    m = _lib().LLMatcher(_ll_tokenizer(tokenizer), json_schema_grammar(schema))
    assert m.consume_tokens(tokenizer.encode(text)) if text else True, m.get_error()
    return m, Quote().scan(text.encode())


def _close(tokenizer, vocab, schema: dict[str, Any], text: str, limit: int = 200) -> tuple[str, int]:
    m, quote = _matcher(tokenizer, schema, text)
    path = closing_path(m, vocab, quote, limit)
    assert path.complete, (text, path)
    return b"".join(vocab.token_bytes[t] for t in path.tokens).decode(), len(path.tokens)


def test_an_open_array_of_strings_closes_in_two_tokens_or_fewer(smol_tokenizer, vocab):
    tail, n = _close(smol_tokenizer, vocab, FRUITS, '{"fruits": ["apple", "ban')
    assert tail == '"]}' and n <= 2
    tail, n = _close(smol_tokenizer, vocab, FRUITS, '{"fruits": ["apple",')  # after a separator: the smallest item
    assert json.loads('{"fruits": ["apple",' + tail) == {"fruits": ["apple", ""]} and n <= 2


def test_required_properties_still_to_come_are_written_with_the_smallest_values(smol_tokenizer, vocab):
    head = '{"name": "Mia", "hobbies": ["sp'
    tail, _ = _close(smol_tokenizer, vocab, PERSON, head)
    assert json.loads(head + tail) == {"name": "Mia", "hobbies": ["sp"], "address": {"city": "", "country": ""}}
    tail, n = _close(smol_tokenizer, vocab, PERSON, "")
    assert json.loads(tail) == {"name": "", "hobbies": [], "address": {"city": "", "country": ""}} and n <= 25
    tail, _ = _close(smol_tokenizer, vocab, BOOKS, '{"books": [{"title": "Du')  # inside an item of an array
    assert json.loads('{"books": [{"title": "Du' + tail) == {"books": [{"title": "Du", "author": ""}]}


def test_a_choice_of_enum_values_takes_the_shortest(smol_tokenizer, vocab):
    schema = {"type": "object", "properties": {"zone": {"enum": ["Europe/Paris", "America/Los_Angeles", "UTC"]}},
              "required": ["zone"], "additionalProperties": False}  # fmt: skip
    tail, _ = _close(smol_tokenizer, vocab, schema, '{"zone": ')
    assert json.loads('{"zone": ' + tail) == {"zone": "UTC"}


def test_the_walk_leaves_the_matcher_where_it_was(smol_tokenizer, vocab):
    m, quote = _matcher(smol_tokenizer, FRUITS, '{"fruits": ["a')
    before = m.compute_bitmask()
    closing_path(m, vocab, quote, 200)
    assert m.compute_bitmask() == before and not m.is_accepting()
    assert closing_path(m, vocab, quote, 1).complete is False  # a limit too tight to close says so


def test_from_any_point_of_random_schemas_the_walk_closes_to_valid_json(smol_tokenizer, vocab):
    """60 random schemas (nested objects, enums with escapes, arrays, numbers), each entered by a random walk over
    the grammar's allowed tokens (strings cut anywhere, escapes, unicode): the closing parses and validates."""
    rng = random.Random(3)
    lengths = []
    for _ in range(60):
        schema = unbounded(random_schema(rng))
        m, quote = _matcher(smol_tokenizer, schema)
        taken: list[int] = []
        for _ in range(rng.randint(0, 40)):
            bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint32)
            allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))  # [K] token ids
            allowed = allowed[allowed < len(vocab.token_bytes)]
            allowed = allowed[vocab.lengths[allowed] > 0]  # not the end of the reply
            if not allowed.size or (m.is_accepting() and rng.random() < 0.3):
                break
            token = int(allowed[rng.randrange(allowed.size)])
            assert m.consume_token(token)
            taken.append(token)
            quote = quote.scan(vocab.token_bytes[token])
        path = closing_path(m, vocab, quote, 400)
        text = b"".join(vocab.token_bytes[t] for t in [*taken, *path.tokens]).decode()
        assert path.complete, (schema, text)
        validate(json.loads(text), schema)
        lengths.append(len(path.tokens))
    assert max(lengths) > 10  # some walks stopped deep in nested objects with required keys still to come


def _run(engine: Engine, reqs: list[GenerateRequest]) -> list[tuple[str, FinishEvent]]:
    out = []
    for stream in [engine.submit(r) for r in reqs]:
        _, text, last = stream.collect()
        assert isinstance(last, FinishEvent), last
        out.append((text, last))
    return out


def _ask(name: str, schema: dict[str, Any], max_tokens: int, close: bool = True, seed: int = 0,
         temperature: float = 0.0, ask: str = "Reply in JSON.") -> GenerateRequest:  # fmt: skip
    sampling = SamplingParams(temperature=temperature, seed=seed, max_new_tokens=max_tokens)
    constraint = Constraint(json_schema_grammar(schema), close_at_limit=close)
    return GenerateRequest(name, (ChatMessage("user", ask),), sampling, constraint=constraint)


def test_a_random_model_that_never_stops_closes_every_schema_at_its_limit(tiny_chat_model, smol_tokenizer, vocab):
    """Random objects with unbounded strings and arrays (a random model writes them until max_tokens), each at a
    limit from its smallest instance's length to 40 tokens more (8 slots decoding together, greedy and sampled):
    every reply validates."""
    rng = random.Random(5)
    engine = Engine(tiny_chat_model(3), smol_tokenizer, max_slots=8, max_seq_len=1024, native="off")
    cases = []
    while len(cases) < 24:
        schema = unbounded(random_object(rng))
        smallest = closing_path(_matcher(smol_tokenizer, schema)[0], vocab, Quote(), CLOSE_WINDOW_TOKENS)
        if smallest.complete:
            cases.append((schema, len(smallest.tokens) + rng.randint(0, 40)))
    engine.start()
    try:
        results = _run(engine, [_ask(f"r{i}", s, n, seed=i, temperature=i % 2) for i, (s, n) in enumerate(cases)])
    finally:
        engine.stop()
    for (schema, limit), (text, fin) in zip(cases, results):
        validate(json.loads(text), schema)
        assert fin.generated <= limit and fin.reason in ("stop", "length"), (fin, text)
    assert sum(fin.reason == "length" for _, fin in results) >= 8  # (13 of 24 today) closed by the limit, not the model


def test_a_request_that_does_not_ask_to_close_is_cut_as_before(tiny_chat_model, smol_tokenizer):
    engine = Engine(tiny_chat_model(3), smol_tokenizer, max_slots=2, max_seq_len=1024, native="off")
    engine.start()
    try:
        [(cut, fin), (closed, fin_closed)] = _run(engine, [_ask("a", FRUITS, 30, close=False), _ask("b", FRUITS, 30)])
    finally:
        engine.stop()
    assert fin.reason == fin_closed.reason == "length" and fin.generated == 30
    with pytest.raises(ValueError):
        json.loads(cut)
    assert json.loads(closed)["fruits"]


def test_the_room_left_in_the_context_is_a_limit_too(tiny_chat_model, smol_tokenizer):
    """max_tokens far off, the context nearly full: the reply closes where the cache ends ("context", a "length" on
    the wire)."""
    engine = Engine(tiny_chat_model(3), smol_tokenizer, max_slots=1, max_seq_len=160, native="off")
    req = _ask("ctx", FRUITS, 500, ask="Reply in JSON. " + "Name fruits please. " * 20)
    stream = engine.submit(req)
    while engine.step() is not None:
        pass
    _, text, fin = stream.collect()
    assert fin.reason == "context" and fin.generated < 60, fin
    assert json.loads(text)["fruits"]


@pytest.mark.slow
@pytest.mark.parametrize("schema,max_tokens,ask", [
    (FRUITS, 24, "List five fruits."), (FRUITS, 40, "List five fruits."),
    ({"type": "array", "items": S, "minItems": 1}, 24, "Name some colours."),
    (BOOKS, 24, "List three books with authors."), (PERSON, 40, "Describe a person with hobbies."),
])  # fmt: skip
def test_the_embedded_model_at_a_tight_limit_still_writes_valid_json(smol_engine, schema, max_tokens, ask):
    """Without closing, the 135M model was cut inside the array in 4 of these 5 (docs/tools.md)."""
    [(text, fin)] = _run(smol_engine, [_ask(f"smol-{max_tokens}", schema, max_tokens, ask=f"{ask} Reply in JSON.")])
    value = json.loads(text)
    validate(value, schema)
    assert fin.reason == "length" and fin.generated <= max_tokens, (fin, text)
    assert json.dumps(value) != json.dumps(json.loads(_smallest(smol_engine, schema)))  # the model wrote some of it


def _smallest(engine: Engine, schema: dict[str, Any]) -> str:
    vocab = vocabulary(engine.tokenizer, _ll_tokenizer(engine.tokenizer))
    path = closing_path(_matcher(engine.tokenizer, schema)[0], vocab, Quote(), 200)
    return b"".join(vocab.token_bytes[t] for t in path.tokens).decode()
