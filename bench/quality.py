"""Does the model answer right? Everyday spoken questions (bench/quality_questions.yaml) put to each model as the
server puts a turn to it, scored by bench/quality_score.py: how to choose the default LLM.

`python -m bench.quality [--models embedded,/path/model.gguf] [--persona assistant] [--tiny] [--out F] [--show-wrong]
[--conversation N]`: each model is loaded through llm_engine with the shipped config's LLM settings (quant, dtype, KV
cache ...), asked every question greedily in a fresh session under the persona's system prompt (no tools: answer
quality alone; with --conversation N, N at a time as one conversation each, every reply kept in its history), and
a markdown table gives right / total, per category, median first-token ms, decode tok/s and load seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.quality_score import Question, by_category, categories, parse_questions, percent, score

QUESTIONS = Path(__file__).with_name("quality_questions.yaml")
TINY = 4  # --tiny: the first questions, enough to run the whole path in a test


@dataclass(frozen=True)
class Answer:
    id: str
    category: str
    question: str
    reply: str
    right: bool
    finish: str  # the engine's finish reason ("stop", "length") or its error message
    first_token_ms: float
    decode_tok_s: float


@dataclass(frozen=True)
class ModelRun:
    source: str
    path: str = ""
    error: str | None = None  # why it did not run (not found, failed to load); then nothing else is set
    load_s: float = 0.0
    answers: tuple[Answer, ...] = field(default=())

    @property
    def right(self) -> int:
        return sum(a.right for a in self.answers)

    def counts(self, order: list[str]) -> dict[str, tuple[int, int]]:
        return by_category(((a.category, a.right) for a in self.answers), order)

    def median(self, name: str) -> float:
        values = [getattr(a, name) for a in self.answers if getattr(a, name) > 0]
        return statistics.median(values) if values else 0.0


def load_questions(path: Path = QUESTIONS) -> tuple[Question, ...]:
    return parse_questions(yaml.safe_load(path.read_text()))


def persona_prompt(name: str) -> str:
    """The persona's system prompt, from the shipped configs/personas/NAME.yaml."""
    from parley.config import DEFAULT_CONFIG

    return str(yaml.safe_load((DEFAULT_CONFIG.parent / "personas" / f"{name}.yaml").read_text())["system_prompt"])


def persona_greeting(name: str) -> str:
    """The persona's greeting (the first assistant message of a voice session), or ""."""
    from parley.config import DEFAULT_CONFIG

    return str(yaml.safe_load((DEFAULT_CONFIG.parent / "personas" / f"{name}.yaml").read_text()).get("greeting") or "")


def load_engine(path: Path, device: str | None, quant: str | None) -> Any:
    """An Engine built as parley/runtime.py builds the server's, from the shipped config's LLM settings (device and
    quant overridable, to see what a setting costs in answers)."""
    from llm_engine.engine import Engine
    from llm_engine.threads import on_own_thread
    from parley.config import load_config

    m = load_config().models.llm
    device = device or m.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return on_own_thread(lambda: Engine.from_path(
        path, device=device, dtype=m.dtype, max_seq_len=m.max_seq_len, max_slots=m.max_slots, quant=quant or m.quant,
        group_size=m.group_size, self_draft=m.self_draft, cuda_graphs=m.cuda_graphs, native=m.native,
        kv_cache=m.kv_cache, prefix_cache=m.prefix_cache))  # fmt: skip


def ask(engine: Any, system: str, item: Question, max_new_tokens: int, history: tuple = (), session: str = "") -> Answer:
    """One question, greedy: in a fresh session (released after), or as the next turn of `session` after `history`
    (ChatMessages: the conversation so far, kept by the caller)."""
    from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams

    fresh = not session
    session = session or f"quality-{item.id}"
    messages = (ChatMessage("system", system), *history, ChatMessage("user", item.question))
    try:
        _, text, fin = engine.submit(GenerateRequest(session, messages, SamplingParams(max_new_tokens=max_new_tokens))).collect()
    finally:
        if fresh:
            engine.release(session)
    reply = text.strip()
    if not isinstance(fin, FinishEvent):
        return Answer(item.id, item.category, item.question, reply, False, f"error: {fin.message}", 0.0, 0.0)
    t = fin.timings
    return Answer(item.id, item.category, item.question, reply, score(reply, item), fin.reason, t.first_token_ms,
                  t.decode_tokens_per_s)  # fmt: skip


def warm(engine: Any, system: str) -> None:
    """One short turn first, as the server warms its engine at start, so no question pays for first-call costs."""
    from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams

    messages = (ChatMessage("system", system), ChatMessage("user", "Hi"))
    engine.submit(GenerateRequest("quality-warm", messages, SamplingParams(max_new_tokens=4))).collect()
    engine.release("quality-warm")


def conversations(engine: Any, system: str, greeting: str, items: tuple[Question, ...], max_new_tokens: int,
                  turns: int) -> tuple[Answer, ...]:
    """The questions `turns` at a time, each group one conversation: the persona's greeting, then every question and
    the reply as given (a voice session's history), so each answer is read with the replies before it in view."""
    from llm_engine.request import ChatMessage

    answers: list[Answer] = []
    for start in range(0, len(items), turns):
        session, history = f"quality-conversation-{start}", [ChatMessage("assistant", greeting)] if greeting else []
        try:
            for item in items[start : start + turns]:
                answer = ask(engine, system, item, max_new_tokens, tuple(history), session)
                answers.append(answer)
                history += [ChatMessage("user", item.question), ChatMessage("assistant", answer.reply)]
        finally:
            engine.release(session)
    return tuple(answers)


def run_model(source: str, items: tuple[Question, ...], system: str, max_new_tokens: int, device: str | None,
              quant: str | None, conversation: tuple[str, int] | None = None) -> ModelRun:
    from parley.locate import ModelNotFound, resolve

    try:
        path = resolve("llm", source)
    except ModelNotFound as err:
        return ModelRun(source, error=f"not found: {err}")
    t0 = time.perf_counter()
    try:
        engine = load_engine(path, device, quant)
    except Exception as err:  # noqa: BLE001 - one model that will not load must not stop the others
        return ModelRun(source, str(path), error=f"failed to load: {type(err).__name__}: {err}")
    load_s = time.perf_counter() - t0
    engine.start()
    try:
        warm(engine, system)
        if conversation is None:
            answers = tuple(ask(engine, system, q, max_new_tokens) for q in items)
        else:
            answers = conversations(engine, system, conversation[0], items, max_new_tokens, conversation[1])
    finally:
        engine.stop()
    return ModelRun(source, str(path), None, load_s, answers)


def label(source: str) -> str:
    return Path(source).name if "/" in source else source


def table(runs: list[ModelRun], order: list[str]) -> list[str]:
    """The markdown table of the runs that answered."""
    head = ["model", "right / total", "%", *order, "first token ms (median)", "decode tok/s (median)", "load s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        if r.error:
            continue
        counts = r.counts(order)
        cells = [label(r.source), f"{r.right} / {len(r.answers)}", f"{percent(counts):.0f}",
                 *(f"{counts[c][0]}/{counts[c][1]}" if c in counts else "-" for c in order),
                 f"{r.median('first_token_ms'):.0f}", f"{r.median('decode_tok_s'):.1f}", f"{r.load_s:.1f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="embedded", help="comma list of LLM sources parley.locate accepts (embedded, a .gguf, a folder)")
    p.add_argument("--persona", default="assistant", help="the persona whose system prompt is used (configs/personas/NAME.yaml)")
    p.add_argument("--questions", type=Path, default=QUESTIONS, help="the question file")
    p.add_argument("--max-tokens", type=int, default=80, help="max new tokens per reply")
    p.add_argument("--device", help="cpu | cuda (default: the shipped config's)")
    p.add_argument("--quant", choices=("none", "int8", "int4"), help="weight quantization (default: the shipped config's)")
    p.add_argument("--tiny", action="store_true", help=f"the first {TINY} questions only (the test's form)")
    p.add_argument("--out", type=Path, help="write every reply and verdict here as JSON")
    p.add_argument("--show-wrong", action="store_true", help="list each model's wrong replies after the table")
    p.add_argument("--conversation", type=int, default=0, metavar="N",
                   help="ask the questions N at a time as one conversation each (after the persona's greeting, every "
                        "reply kept), not each in a fresh session")
    args = p.parse_args(argv)

    items = load_questions(args.questions)
    items = items[:TINY] if args.tiny else items
    order = categories(items)
    system = persona_prompt(args.persona)
    runs = []
    for source in (s.strip() for s in args.models.split(",") if s.strip()):
        greeting = persona_greeting(args.persona)
        run = run_model(source, items, system, args.max_tokens, args.device, args.quant,
                        (greeting, args.conversation) if args.conversation > 0 else None)
        if run.error:
            print(f"{source}: skipped, {run.error}", flush=True)
        runs.append(run)

    quant = args.quant or "as configured"
    asked = f"in conversations of {args.conversation}" if args.conversation > 0 else "each in a fresh session"
    print(f"\nAnswer quality: {len(items)} spoken questions {asked}, persona {args.persona!r}, quant {quant}, greedy, "
          f"up to {args.max_tokens} tokens\n")
    print("\n".join(table(runs, order)))
    if args.show_wrong:
        for r in (r for r in runs if not r.error):
            wrong = [a for a in r.answers if not a.right]
            print(f"\n{label(r.source)}: {len(wrong)} wrong")
            for a in wrong:
                print(f"- {a.id}: {a.question} -> {a.reply!r}")
    if args.out:
        args.out.write_text(json.dumps({
            "persona": args.persona, "conversation": args.conversation, "quant": quant, "max_new_tokens": args.max_tokens, "questions": len(items), "categories": order,
            "models": [{**asdict(r), "right": r.right, "total": len(r.answers), "by_category": r.counts(order),
                        "first_token_ms_median": r.median("first_token_ms"), "decode_tok_s_median": r.median("decode_tok_s")}
                       for r in runs]}, indent=1))  # fmt: skip
    return 0 if any(not r.error for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
