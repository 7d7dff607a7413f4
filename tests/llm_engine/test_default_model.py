"""The default install's assistant answers: the embedded default LLM (parley.embedded_llms.DEFAULT_LLM), loaded as the
server loads it, under the shipped assistant persona, answers a few of bench.quality's questions with an accepted
answer, in one or two spoken sentences (no markdown, no list). The questions are ones both Qwen2.5 candidates answer
right in bench.quality (docs/models.md has the whole set's score): a failure here is the pipeline (template, persona,
engine), not the model's knowledge.
"""
from __future__ import annotations

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
