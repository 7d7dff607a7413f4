"""Tool calling on the embedded model: valid calls, the right tool, the right arguments, unwanted calls, and what the
grammar's mask costs per decoded token. `python -m bench.tools [--tiny]`; table and command in docs/benchmarks.md.

Requests of its own (time, arithmetic, a timer, and questions that want no tool) go through the engine in process
with the chat API's tool layer (llm_engine.tool_calls): once with tool_choice auto (the model chooses) and once
forced (required: the grammar holds from the first token).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llm_engine.constrain import Constraint, Guide, json_schema_grammar, warm
from llm_engine.engine import Engine
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from llm_engine.tool_calls import CallParser, call_constraint
from llm_engine.tool_format import ToolSpec
from voice.builtin_tools import calculate
from voice.tool_registry import tool_from

TIMER = {"type": "object", "properties": {"seconds": {"type": "integer", "minimum": 1, "maximum": 86400},
         "label": {"type": "string", "maxLength": 40}}, "required": ["seconds"], "additionalProperties": False}  # fmt: skip
TOOLS = (
    tool_from(lambda time_zone="": "", name="current_time", parameters={"type": "object", "properties": {
        "time_zone": {"type": "string", "maxLength": 40}}, "required": [], "additionalProperties": False}).spec,  # fmt: skip
    tool_from(calculate).spec,
    ToolSpec("set_timer", "Start a timer that speaks when it is due.", json.dumps(TIMER)),
)
SYSTEM = "You are a voice assistant. Use a tool when the question needs one."

# (question, the tool wanted or None, a check of its arguments)
CASES: list[tuple[str, str | None, object]] = [
    ("What time is it?", "current_time", None),
    ("What's the time right now?", "current_time", None),
    ("Can you tell me the current time?", "current_time", None),
    ("What day is it today?", "current_time", None),
    ("What is the date today?", "current_time", None),
    ("What time is it in Tokyo?", "current_time", None),
    ("What is 12 times 7?", "calculate", 84),
    ("What is 345 plus 678?", "calculate", 1023),
    ("How much is 100 divided by 8?", "calculate", 12.5),
    ("What is 2 to the power of 10?", "calculate", 1024),
    ("Calculate 15 minus 27.", "calculate", -12),
    ("What's 9 times 9?", "calculate", 81),
    ("What is 1000 minus 1?", "calculate", 999),
    ("What is 7 plus 8 times 2?", "calculate", 23),
    ("Set a timer for five minutes.", "set_timer", 300),
    ("Set a timer for 10 seconds.", "set_timer", 10),
    ("Start a one minute timer.", "set_timer", 60),
    ("Remind me in two minutes to check the oven.", "set_timer", 120),
    ("Set a timer for 30 seconds for the tea.", "set_timer", 30),
    ("Timer for an hour please.", "set_timer", 3600),
    ("Tell me a joke.", None, None),
    ("What is the capital of France?", None, None),
    ("Who wrote Hamlet?", None, None),
    ("Say hello to my friend Anna.", None, None),
    ("What colour is the sky?", None, None),
    ("How are you today?", None, None),
    ("Give me a short poem about rain.", None, None),
    ("What is a verb?", None, None),
    ("Thank you, that's all.", None, None),
    ("Can you recommend a good book?", None, None),
    ("Why do cats purr?", None, None),
    ("What language is spoken in Brazil?", None, None),
]  # fmt: skip


@dataclass
class Outcome:
    calls: list[tuple[str, dict]]  # (name, arguments) of the calls that parsed
    invalid: int  # calls written whole that did not parse (none, under the grammar)
    cut: int  # a call still being written when max_tokens ran out


def right_args(name: str, args: dict, expected: object) -> bool:
    if expected is None:
        return True
    if name == "calculate":
        try:
            return abs(float(calculate(args.get("expression", ""))) - float(expected)) < 1e-9  # type: ignore[arg-type]
        except (ValueError, ArithmeticError):
            return False
    return args.get("seconds") == expected


def ask(engine: Engine, question: str, choice: str, max_tokens: int) -> Outcome:
    req = GenerateRequest("bench-tools", (ChatMessage("system", SYSTEM), ChatMessage("user", question)),
                          SamplingParams(max_new_tokens=max_tokens), constraint=call_constraint(TOOLS, choice, parallel=False),
                          tools=TOOLS)  # fmt: skip
    _, text, fin = engine.submit(req).collect()
    parser = CallParser(lambda: "call")
    parser.feed(text)
    parser.close()
    begun = text.count("<tool_call>")
    cut = int(getattr(fin, "reason", "") == "length" and begun > text.count("</tool_call>"))
    return Outcome([(c.name, json.loads(c.arguments)) for c in parser.calls], begun - cut - len(parser.calls), cut)


def accuracy(engine: Engine, cases: list, choice: str, max_tokens: int) -> dict[str, float | int]:
    tool_cases = [c for c in cases if c[1] is not None]
    rows = [(c, ask(engine, c[0], choice, max_tokens)) for c in (tool_cases if choice == "required" else cases)]
    made = sum(len(o.calls) + o.invalid for _, o in rows)  # calls written whole
    valid = sum(len(o.calls) for _, o in rows)
    wanted = [(c, o) for c, o in rows if c[1] is not None]
    right_tool = [(c, o) for c, o in wanted if o.calls and o.calls[0][0] == c[1]]
    right = sum(1 for c, o in right_tool if right_args(o.calls[0][0], o.calls[0][1], c[2]))
    unwanted = [o for c, o in rows if c[1] is None and o.calls]
    no_tool = sum(1 for c, _ in rows if c[1] is None)
    return {"requests": len(rows), "calls": made, "valid": valid, "wanted": len(wanted), "right_tool": len(right_tool),
            "right_args": right, "no_tool_questions": no_tool, "unwanted": len(unwanted),
            "cut": sum(o.cut for _, o in rows)}  # fmt: skip


def mask_cost(engine: Engine, rounds: int, tokens: int) -> dict[str, float]:
    """Decode tok/s free and under a grammar (alternated, medians), and the mask's own time per token: the tokens a
    constrained reply produced are replayed through a fresh Guide (mask + accept), against the decode step's time."""
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 20}}},
              "required": ["items"], "additionalProperties": False}  # fmt: skip
    constraint = Constraint(json_schema_grammar(schema))
    msgs = (ChatMessage("user", "List some fruits as JSON."),)
    free, guided, per_token_ms, step_ms = [], [], [], []
    for _ in range(rounds):
        for c, out in ((None, free), (constraint, guided)):
            req = GenerateRequest("bench-mask", msgs, SamplingParams(max_new_tokens=tokens), constraint=c)
            ids, _, fin = engine.submit(req).collect()
            out.append(fin.timings.decode_tokens_per_s)
            if c is not None and fin.timings.decode_tokens:
                step_ms.append(fin.timings.decode_ms / fin.timings.decode_tokens)
                guide = Guide(engine.tokenizer, c)
                logits = torch.zeros(engine.tokenizer.vocab_size)
                t0 = time.perf_counter()
                for t in ids:
                    guide.mask(logits)
                    guide.accept(t, "")
                per_token_ms.append(1000 * (time.perf_counter() - t0) / len(ids))
    mask_ms, decode_ms = statistics.median(per_token_ms), statistics.median(step_ms)
    return {"free_tok_s": statistics.median(free), "grammar_tok_s": statistics.median(guided), "mask_ms": mask_ms,
            "decode_ms": decode_ms, "mask_share": mask_ms / decode_ms}  # fmt: skip


def format_table(auto: dict, forced: dict, cost: dict, model: str, n: int) -> str:
    def pct(a: float, b: float) -> str:
        return f"{100 * a / b:.0f} %" if b else "-"

    lines = [f"\nTool calls, {model}, {n} questions of bench.tools (greedy), load average "
             f"{os.getloadavg()[0]:.1f} (others' work on the same cores skews every rate)",  # fmt: skip
             f"{'tool_choice':<12}{'requests':>9}{'valid calls':>13}{'cut by max_tokens':>19}{'right tool':>12}{'right args':>12}"
             f"{'unwanted calls':>16}"]
    for name, r in (("auto", auto), ("required", forced)):
        unwanted = f"{r['unwanted']}/{r['no_tool_questions']}" if r["no_tool_questions"] else "-"
        valid = f"{pct(r['valid'], r['calls'])} of {r['calls']}"
        lines.append(f"{name:<12}{r['requests']:>9}{valid:>13}{r['cut']:>19}{pct(r['right_tool'], r['wanted']):>12}{pct(r['right_args'], r['wanted']):>12}{unwanted:>16}")  # fmt: skip
    lines.append(cost_line(cost))
    return "\n".join(lines)


def cost_line(cost: dict[str, float]) -> str:
    return (f"decode tok/s free {cost['free_tok_s']:.1f}, under a grammar {cost['grammar_tok_s']:.1f}; the mask "
            f"{cost['mask_ms']:.3f} ms a token = {100 * cost['mask_share']:.1f} % of a decode step ({cost['decode_ms']:.2f} ms)")  # fmt: skip


def open_engine(path: Path) -> Engine:
    """The engine as this bench runs it (two slots), started, with the grammar library's tables warm."""
    from llm_engine.threads import on_own_thread

    engine = on_own_thread(lambda: Engine.from_path(path, max_seq_len=2048, max_slots=2))
    warm(engine.tokenizer)
    engine.start()
    return engine


def grammar_cost(path: Path, rounds: int, tokens: int) -> dict[str, float]:
    """mask_cost on an engine of its own (bench.llm's grammar row)."""
    engine = open_engine(path)
    try:
        return mask_cost(engine, rounds, tokens)
    finally:
        engine.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a .gguf or HF folder (default: the embedded SmolLM2)")
    p.add_argument("--tiny", action="store_true", help="4 requests, 1 speed round (the test's form)")
    p.add_argument("--out", help="write the numbers as JSON here")
    args = p.parse_args()
    from bench.llm_speed import llm_path

    path = llm_path(args.model)
    engine = open_engine(path)
    cases = [CASES[0], CASES[6], CASES[14], CASES[20]] if args.tiny else CASES
    try:
        auto = accuracy(engine, cases, "auto", 40 if args.tiny else 80)
        forced = accuracy(engine, cases, "required", 120)
        cost = mask_cost(engine, 1 if args.tiny else 5, 16 if args.tiny else 64)
    finally:
        engine.stop()
    print(format_table(auto, forced, cost, path.name, len(cases)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"auto": auto, "required": forced, "mask": cost, "requests": len(cases)}, f, indent=1)


if __name__ == "__main__":
    main()
