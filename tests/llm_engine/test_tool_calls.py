"""Tool calls in the engine: forced calls on random-weight models and on the embedded model always parse and match
their tool's schema (our prompt format on the embedded tokenizer and a tiny Llama 3 GGUF; the template's own
`<tool_call>` format on a tiny Qwen2.5-style GGUF); streamed deltas reassemble to the whole call; tool_choice is
honoured; bad tools are refused."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import tiny_gguf as tg
from schemas import random_object, validate

from llm_engine.constrain import GrammarError
from llm_engine.engine import Engine
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams
from llm_engine.tool_calls import ArgumentsDelta, CallDone, CallParser, CallStarted, TextDelta, call_constraint, opens_call
from llm_engine.tool_format import ToolCall, ToolSpec, call_text

# A template in the Hermes / Qwen2.5 style of our own writing: tools listed in the system turn, calls as <tool_call>.
QWEN_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\nCall a tool with "
    "<tool_call>\n{\"name\": NAME, \"arguments\": ARGS}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' and loop.first and tools %}"
    "{% elif m['role'] == 'assistant' and m['tool_calls'] is defined %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% for c in m['tool_calls'] %}<tool_call>\n{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m['content'] }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def random_tools(rng: random.Random) -> list[tuple[ToolSpec, dict]]:
    return [(ToolSpec(f"tool_{i}_{rng.randint(0, 99)}", "a random tool", json.dumps(s)), s)
            for i, s in enumerate(random_object(rng) for _ in range(rng.randint(1, 3)))]  # fmt: skip


def parse(text: str) -> tuple[str, list[ToolCall], list]:
    ids = itertools.count()
    parser = CallParser(lambda: f"call_{next(ids)}")
    deltas = parser.feed(text) + parser.close()
    content = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    return content, parser.calls, deltas


def forced_calls(engine: Engine, n: int, seed: int) -> None:
    """n requests, each with random tools and tool_choice required or one tool's name, decoded together."""
    rng = random.Random(seed)
    cases, streams = [], []
    for i in range(n):
        tools = random_tools(rng)
        choice = rng.choice(["required", tools[-1][0].name])
        req = GenerateRequest(f"t{i}", (ChatMessage("user", "do something"),),
                              SamplingParams(temperature=0.0 if i % 2 else 1.0, seed=i, max_new_tokens=1200),
                              constraint=call_constraint([t for t, _ in tools], choice, parallel=i % 3 == 0),
                              tools=tuple(t for t, _ in tools))  # fmt: skip
        cases.append((tools, choice))
        streams.append(engine.submit(req))
    for (tools, choice), stream in zip(cases, streams):
        _, text, fin = stream.collect()
        assert isinstance(fin, FinishEvent) and fin.reason == "stop", (fin.reason, text)
        content, calls, _ = parse(text)
        assert content == "" and calls, text[:300]
        for call in calls:
            schema = dict((t.name, s) for t, s in tools)[call.name]
            assert choice in ("required", call.name)
            validate(json.loads(call.arguments), schema)
            assert call_text(call) in text  # what the grammar wrote is what a history renders back


def test_forced_calls_on_a_random_model_with_the_embedded_tokenizer_always_validate(tiny_chat_model, smol_tokenizer):
    engine = Engine(tiny_chat_model(8, 3072), smol_tokenizer, max_slots=8, max_seq_len=3072, native="off")
    engine.start()
    try:
        forced_calls(engine, 24, seed=1)
    finally:
        engine.stop()


@pytest.mark.slow
def test_forced_calls_on_the_embedded_model_itself_always_validate(smol_engine):
    """The real SmolLM2-135M weights (trained text, not noise) under the same random tools and schemas."""
    forced_calls(smol_engine, 12, seed=4)


@pytest.fixture(scope="module")
def gguf_engine(tmp_path_factory, smol_path):
    """-> make(family) -> an Engine over a tiny random GGUF of that family (qwen2: a template with tools)."""
    from llm_engine.gguf_loader import prepare_gguf

    smol = prepare_gguf(smol_path)
    root = tmp_path_factory.mktemp("tool-families")
    made: dict[str, Engine] = {}

    def make(family: str) -> Engine:
        if family not in made:
            tok = tg.tokenizer_for(family, smol)
            if family == "qwen2":
                tok.add_tokens(["<tool_call>", "</tool_call>"])
                tok.chat_template = QWEN_TOOLS_TEMPLATE
            hf = tg.build_hf(family, root / family / "hf", tok)
            gguf = tg.write_gguf(hf, root / family / "F32.gguf", family)
            made[family] = Engine.from_path(gguf, max_seq_len=3072, max_slots=8, native="off")
            made[family].start()
        return made[family]

    yield make
    for engine in made.values():
        engine.stop()


@pytest.fixture(autouse=True)
def _cache_root(tmp_path, monkeypatch):
    monkeypatch.setattr("llm_engine.gguf_loader.default_cache_root", lambda: tmp_path / "gguf-cache")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_forced_calls_on_tiny_random_gguf_families_always_validate(gguf_engine, family):
    engine = gguf_engine(family)
    assert engine.tokenizer.renders_tools == (family == "qwen2")
    forced_calls(engine, 12, seed=2)


def test_the_native_template_renders_tools_calls_and_results(gguf_engine):
    tok = gguf_engine("qwen2").tokenizer
    call = ToolCall("call_1", "get_time", '{"zone": "UTC"}')
    msgs = [ChatMessage("user", "time?"), ChatMessage("assistant", "", (call,)), ChatMessage("tool", "12:00", tool_call_id="call_1")]
    text = tok.render_chat(msgs, tools=[ToolSpec("get_time", "the time")])
    assert '"name": "get_time"' in text and "<tool_response>\n12:00" in text and call_text(call) in text


def test_a_sessions_system_prompt_carries_the_tools_as_the_template_words_them(gguf_engine, smol_tokenizer):
    """A voice session keeps one system text for all its requests: with a template that renders tools it is the
    template's own tool section, so the prompt renders exactly as the template renders the tools (no tools argument
    needed on every request); a template without tools says None (our prompt format then)."""
    tok = gguf_engine("qwen2").tokenizer
    tools = [ToolSpec("get_time", "the time"), ToolSpec("add", "adds", '{"type": "object", "properties": {"a": {"type": "integer"}}}')]
    text = tok.system_with_tools("Be brief.", tools)
    assert text is not None and text.startswith("Be brief.") and '"name": "add"' in text
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "time?"), ChatMessage("assistant", "It is noon."),
            ChatMessage("user", "and now?")]  # fmt: skip
    assert tok.render_chat([ChatMessage("system", text), *msgs[1:]]) == tok.render_chat(msgs, tools=tools)
    assert tok.system_with_tools("", tools) is None and tok.system_with_tools("Be brief.", []) is None
    assert smol_tokenizer.system_with_tools("Be brief.", tools) is None


def test_our_format_puts_tools_in_the_system_prompt_and_calls_in_the_assistant_text(smol_tokenizer):
    call = ToolCall("call_1", "add", '{"a": 1, "b": 2}')
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "1+2?"), ChatMessage("assistant", "", (call,)),
            ChatMessage("tool", "3", tool_call_id="call_1")]  # fmt: skip
    text = smol_tokenizer.render_chat(msgs, tools=[ToolSpec("add", "adds two numbers")])
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    assert f"<|im_start|>assistant\n{call_text(call)}<|im_end|>" in text and "<|im_start|>tool\n3<|im_end|>" in text
    plain = [ChatMessage("user", "hi")]
    assert smol_tokenizer.render_chat(plain) == smol_tokenizer.hf.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)  # no tools: as before


def test_streamed_deltas_reassemble_to_the_whole_call_however_the_text_is_cut():
    calls = [ToolCall("", "f", '{"s": "a \\"quoted\\" }\\n{ brace", "n": [1, 2.5, {"x": null}]}'), ToolCall("", "g", "{}")]
    text = "Let me check. " + "\n".join(call_text(c) for c in calls)
    rng = random.Random(0)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        parser = CallParser(lambda: "id")
        deltas = [d for p in pieces for d in parser.feed(p)] + parser.close()
        args = {i: "".join(d.text for d in deltas if isinstance(d, ArgumentsDelta) and d.index == i) for i in (0, 1)}
        names = [d.name for d in deltas if isinstance(d, CallStarted)]
        assert names == ["f", "g"] and [args[0], args[1]] == [c.arguments for c in calls]
        assert [d.call.arguments for d in deltas if isinstance(d, CallDone)] == [c.arguments for c in calls]
        assert "".join(d.text for d in deltas if isinstance(d, TextDelta)).strip() == "Let me check."


def test_a_call_cut_short_or_not_parsing_is_text():
    assert parse("<tool_call>\n{not json}\n</tool_call>")[:2] == ("<tool_call>\n{not json}\n</tool_call>", [])
    assert parse("<tool_call>\n{\"na")[:2] == ("<tool_call>\n{\"na", [])
    assert parse("a < b and <tool")[0] == "a < b and <tool"


def test_a_reply_that_begins_with_a_calls_json_is_that_call_written_bare():
    """Qwen2.5's small models write calls under auto as bare JSON, no markers: at the reply's start that is a call,
    streamed as one, ended by the reply's end; anywhere else, or not parsing, it is text."""
    bare = '{"name": "calculate", "arguments": {"expression": "12 * 7"}}'
    for cut in (1, 3, 7, len(bare)):
        ids = itertools.count()
        parser = CallParser(lambda: f"call_{next(ids)}")
        deltas = [d for i in range(0, len(bare), cut) for d in parser.feed((" \n" if i == 0 else "") + bare[i : i + cut])]
        deltas += parser.close()
        assert [c.name for c in parser.calls] == ["calculate"] and json.loads(parser.calls[0].arguments) == {"expression": "12 * 7"}
        assert not [d for d in deltas if isinstance(d, TextDelta)]
        assert isinstance(deltas[0], CallStarted) and isinstance(deltas[-1], CallDone)
        assert "".join(d.text for d in deltas if isinstance(d, ArgumentsDelta)) == parser.calls[0].arguments
    assert parse('{"name": "calc')[:2] == ('{"name": "calc', [])  # cut short: text
    assert parse('{"nope": 1}')[:2] == ('{"nope": 1}', [])
    assert parse('{ a set }')[:2] == ('{ a set }', [])
    assert parse('Sure: {"name": "a", "arguments": {}}')[:2] == ('Sure: {"name": "a", "arguments": {}}', [])
    assert opens_call(' {"name": "a"') and opens_call("<tool_call>\n") and not opens_call('Sure: {"name"')


def test_tool_choice_is_checked():
    tools = [ToolSpec("a"), ToolSpec("b")]
    assert call_constraint(tools, "none") is None
    assert call_constraint(tools, "auto").trigger == "<tool_call>"
    assert call_constraint(tools, "required").trigger is None
    with pytest.raises(ValueError, match="not among the tools"):
        call_constraint(tools, "c")
    with pytest.raises(GrammarError, match="do not compile"):
        call_constraint([ToolSpec("bad", parameters='{"type": "bogus"}')], "required")
    with pytest.raises(GrammarError, match="not JSON"):
        call_constraint([ToolSpec("bad", parameters="{")], "auto")


def test_a_name_forces_that_tool_and_auto_lets_text_through(tiny_chat_model, smol_tokenizer):
    """auto on a random model: it never writes the marker, so the reply is free text and no call."""
    engine = Engine(tiny_chat_model(9, 2048), smol_tokenizer, max_slots=2, max_seq_len=2048, native="off")
    tools = (ToolSpec("alpha"), ToolSpec("beta", parameters='{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}'))
    named = engine.submit(GenerateRequest("a", (ChatMessage("user", "go"),), SamplingParams(max_new_tokens=200),
                                          constraint=call_constraint(tools, "beta"), tools=tools))  # fmt: skip
    auto = engine.submit(GenerateRequest("b", (ChatMessage("user", "go"),), SamplingParams(max_new_tokens=30),
                                         constraint=call_constraint(tools, "auto"), tools=tools))  # fmt: skip
    while engine.step() is not None:
        pass
    _, calls, _ = parse(named.collect()[1])
    assert [c.name for c in calls] == ["beta"] and isinstance(json.loads(calls[0].arguments)["x"], int)
    _, text, fin = auto.collect()
    assert fin.reason == "length" and "<tool_call>" not in text


def test_a_marker_the_tokenizer_holds_as_one_token_is_taken_as_that_token() -> None:
    """Qwen2.5 writes <tool_call> as its one added token (151657), which the grammar library reads as a token, not as
    the text: a forced call's grammar takes the token (before, a forced call on the default model failed at its
    first token), and a tokenizer without it keeps the text."""
    from llm_engine.constrain import Guide, bound_markers
    from llm_engine.gguf_loader import prepare_gguf
    from llm_engine.tokenizer import Tokenizer
    from parley.locate import find_embedded

    qwen = Tokenizer.from_folder(prepare_gguf(find_embedded("llm", "embedded-0.5b"), weights=False))
    tools = [ToolSpec("current_time", parameters='{"type": "object", "properties": {}, "required": []}')]
    constraint = call_constraint(tools, "required")
    assert constraint is not None and '"<tool_call>"' in constraint.grammar
    bound = bound_markers(constraint, qwen)
    assert "<[151657]>" in bound and "<[151658]>" in bound and '"<tool_call>"' not in bound
    guide = Guide(qwen, constraint)
    call = [151657, *qwen.encode('\n{"name": "current_time", "arguments": {}}\n'), 151658]
    for token in call:
        guide.accept(token, qwen.decode([token]))  # raises where the grammar refuses a token
    assert guide.matcher.is_accepting()
    smol = Tokenizer.from_folder(prepare_gguf(find_embedded("llm", "embedded-135m"), weights=False))
    assert bound_markers(constraint, smol) == constraint.grammar
