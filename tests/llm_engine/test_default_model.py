"""The default install's assistant answers: the embedded default LLM (parley.embedded_llms.DEFAULT_LLM), loaded as the
server loads it, under the shipped assistant persona, answers a few of bench.quality's questions with an accepted
answer, in one or two spoken sentences (no markdown, no list). The questions are ones both Qwen2.5 candidates answer
right in bench.quality (docs/models.md has the whole set's score): a failure here is the pipeline (template, persona,
engine), not the model's knowledge.
"""
from __future__ import annotations

import json
import re

import pytest

from bench.quality import ask, load_engine, load_questions, persona_prompt
from parley.locate import find_embedded

IDS = ("capital-japan", "plants-gas", "multiply", "leap-year", "plural-mouse")


@pytest.fixture(scope="module")
def engine():
    engine = load_engine(find_embedded("llm"), None, None)
    engine.start()
    yield engine
    engine.stop()


def test_the_default_persona_answers_everyday_questions_right(engine) -> None:
    system = persona_prompt("assistant")
    items = {q.id: q for q in load_questions()}
    for qid in IDS:
        answer = ask(engine, system, items[qid], 60)
        assert answer.right, (qid, answer.reply)
        assert answer.finish == "stop", (qid, answer.reply)  # said whole within the cap, not cut off
        assert not re.search(r"[*#`]|^\s*[-\d]+[.)]\s", answer.reply, re.M), answer.reply  # spoken: no markdown or list
        assert len(re.findall(r"[.!?](\s|$)", answer.reply)) <= 2, answer.reply


def test_the_default_model_calls_the_shipped_tools_by_itself_and_answers_the_rest(engine) -> None:
    """Under tool_choice auto with the persona's prompt and the default tools listed, in the template's own wording
    (as a voice session of a persona with `tools: [default]` asks): a question a
    tool answers becomes that tool's call, valid for its schema (the model writes it bare; the grammar takes it from
    its first character), and an everyday question is answered in words."""
    from bench.tools_default import persona_prompts
    from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
    from llm_engine.tool_calls import CallParser, TextDelta, call_constraint

    _, system, specs = persona_prompts(engine.tokenizer.system_with_tools)
    assert "<tools>" in system  # Qwen2.5's own wording of the tools
    for question, wanted in (("What is 12 times 7?", "calculate"), ("Set a timer for five minutes.", "set_timer"),
                             ("What is the capital of France?", None)):  # fmt: skip
        messages = (ChatMessage("system", system), ChatMessage("user", question))
        req = GenerateRequest("tools", messages, SamplingParams(max_new_tokens=80), constraint=call_constraint(specs, "auto"))
        _, text, _ = engine.submit(req).collect()
        parser = CallParser(lambda: "call")
        said = "".join(d.text for d in parser.feed(text) + parser.close() if isinstance(d, TextDelta))
        assert [c.name for c in parser.calls] == ([wanted] if wanted else []), (question, text)
        if wanted == "set_timer":
            assert json.loads(parser.calls[0].arguments)["seconds"] == 300, text
        if wanted is None:
            assert "Paris" in said, text
    engine.release("tools")
