"""How well a model picks out what a user says about themselves (voice.user_memory): labelled user turns, each with
the notes already known, read by the engine as a persona with `memory: true` reads them (the same request, grammar
and parsing); a row per model: facts remembered, turns that remembered something they should not have, forget
requests done right, notes forgotten that should have stayed.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.memory [--models embedded-135m,embedded-0.5b,embedded-1.5b] [--show]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import _stats
from bench.quality import load_engine
from parley.locate import find_embedded

# (notes known, what the user said, a word each new fact must hold (lower case) or None for none, notes to forget).
# None of these are bench's prompt examples (voice.user_memory.EXAMPLES).
CASES: tuple[tuple[tuple[str, ...], str, tuple[str, ...], tuple[str, ...]], ...] = (
    ((), "Hello, I'm Priya.", ("priya",), ()),
    ((), "I'm allergic to peanuts, by the way.", ("peanut",), ()),
    ((), "My daughter Mia turns six next week.", ("mia",), ()),
    ((), "I work night shifts at the hospital.", ("night",), ()),
    ((), "We live in a small flat in Glasgow.", ("glasgow",), ()),
    (("The user's name is Priya.",), "I drive a blue Honda.", ("honda",), ()),
    (("The user's name is Priya.",), "What time is it in Tokyo?", (), ()),
    (("The user's name is Priya.",), "Tell me a joke about cats.", (), ()),
    (("The user's name is Priya.",), "How many grams are in a pound?", (), ()),
    (("The user's name is Priya.",), "Thanks, that's all for now.", (), ()),
    (("The user's name is Priya.", "The user is allergic to peanuts."), "What do you know about me?", (), ()),
    (("The user's name is Priya.", "The user is allergic to peanuts."), "Forget that I'm allergic to peanuts.", (),
     ("The user is allergic to peanuts.",)),
    (("The user's name is Priya.", "The user works night shifts."), "Please forget where I work.", (),
     ("The user works night shifts.",)),
    (("The user's name is Priya.", "The user lives in Glasgow."), "Delete my name from your notes.", (),
     ("The user's name is Priya.",)),
    (("The user lives in Glasgow.", "The user drives a blue Honda."), "I sold the Honda, I ride a bike now.", ("bike",),
     ("The user drives a blue Honda.",)),
    (("The user's name is Priya.",), "I'm learning to play the cello.", ("cello",), ()),
)


def run(engine: object, show: bool) -> dict[str, float]:
    from llm_engine.constrain import Constraint, json_schema_grammar
    from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
    from voice.facts import Fact
    from voice.user_memory import extraction_request, read_answer, schema

    counts = dict(facts=0, facts_right=0, asked_none=0, false_remember=0, forgets=0, forgets_right=0, wrong_forgets=0)
    ms: list[float] = []
    for known, said, wanted, forget in CASES:
        facts = tuple(Fact(i, t) for i, t in enumerate(known, 1))
        constraint = Constraint(json_schema_grammar(schema(facts)), close_at_limit=True)
        messages = tuple(ChatMessage(r, t) for r, t in extraction_request(facts, said))
        t0 = time.perf_counter()
        _, text, _ = engine.submit(GenerateRequest("memory", messages, SamplingParams(max_new_tokens=120),  # type: ignore[attr-defined]
                                                   constraint=constraint)).collect()  # fmt: skip
        ms.append(1000 * (time.perf_counter() - t0))
        new, gone = read_answer(text, facts)
        gone_texts = {f.text for f in facts if f.id in gone}
        counts["facts"] += len(wanted)
        counts["facts_right"] += sum(any(w in n.lower() for n in new) for w in wanted)
        if not wanted:
            counts["asked_none"] += 1
            counts["false_remember"] += bool(new)
        counts["forgets"] += len(forget)
        counts["forgets_right"] += len(gone_texts & set(forget))
        counts["wrong_forgets"] += len(gone_texts - set(forget))
        if show:
            print(f"  {said!r} -> remember {new}, forget {sorted(gone_texts)}")
    return {**counts, "ms_p50": _stats.percentile(ms, 50) or 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="embedded-0.5b", help="comma-separated embedded names or GGUF paths")
    p.add_argument("--show", action="store_true", help="print each turn's reading")
    args = p.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        engine = load_engine(find_embedded("llm", name) if name.startswith("embedded") else Path(name), None, None)
        engine.start()
        try:
            from llm_engine import constrain

            constrain.warm(engine.tokenizer)
            print(f"{name}:")
            c = run(engine, args.show)
        finally:
            engine.stop()
        rows.append([name, f"{c['facts_right']}/{c['facts']}", f"{c['false_remember']}/{c['asked_none']}",
                     f"{c['forgets_right']}/{c['forgets']}", c["wrong_forgets"], _stats.fmt_ms(c["ms_p50"])])  # fmt: skip
    print(_stats.table(("model", "facts remembered", "remembered from no fact", "forgets done", "notes wrongly forgotten",
                        "read p50 ms"), rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
