"""Should the shipped tools be on by default? What they cost and bring in the assistant persona on the embedded model.

`python -m bench.tools_default [--tiny] [--out F]`: the persona's prompt in tokens without and with the default tools
(`tools: [default]`, in our prompt format), a turn's prefill with the session's cache reused and its decode speed
(medians), and, under tool_choice auto with the persona's own prompt, how often bench.tools' questions get the right
tool and how often a question that wants none gets a call; and what the default `tools: auto` offers on this model
(parley.tool_offer) and why. `--model` another .gguf or HF folder; the tools are worded as a voice session words them (the
model's template's own tool section where it has one; then also measured in our prompt format); `--show` each reply. Table and command in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
from types import SimpleNamespace
from typing import Callable, Sequence

import yaml

from bench.tools import CASES
from llm_engine.constrain import warm
from llm_engine.engine import Engine
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from llm_engine.tool_calls import CallParser, call_constraint
from llm_engine.tool_format import ToolSpec
from parley.config import DEFAULT_CONFIG, Persona
from parley.runtime import persona_tools
from parley.tool_offer import llm_tool_support
from voice.llm_bridge import LlmBridge
from voice.tool_turn import with_tools


def persona_prompts(wording: Callable[[str, Sequence[ToolSpec]], str | None] | None = None) -> tuple[str, str, tuple]:
    """(the assistant persona's system prompt, the same with the default tools, their specs). wording: the model's own
    (Tokenizer.system_with_tools, as a voice session words them), else our prompt format."""
    data = yaml.safe_load((DEFAULT_CONFIG.parent / "personas" / "assistant.yaml").read_text())
    base = data["system_prompt"]
    tools, _ = persona_tools("assistant", Persona(name="assistant", display_name="P", system_prompt=base, voice="joe",
                                               tools=("default",)))  # fmt: skip
    specs = tuple(t.spec for t in tools)
    persona = SimpleNamespace(toolbox=SimpleNamespace(specs=lambda: specs), tool_choice="auto", tools=tools)
    return base, with_tools(base, persona, wording=wording or (lambda system, tools: None)), specs


def _run(engine: Engine, session: str, messages: list[ChatMessage], n: int, constraint: object = None) -> tuple[str, object]:
    req = GenerateRequest(session, tuple(messages), SamplingParams(max_new_tokens=n), constraint=constraint)  # type: ignore[arg-type]
    _, text, fin = engine.submit(req).collect()
    return text, fin


def turn_cost(engine: Engine, system: str, rounds: int) -> dict[str, float]:
    """A session's start (its system prompt prefilled), then a turn: its prefill (the cache reused) and decode."""
    turn_ms, tok_s = [], []
    for r in range(rounds):
        session = f"cost-{r}-{hash(system)}"
        _run(engine, session, [ChatMessage("system", system)], 0)
        _, fin = _run(engine, session, [ChatMessage("system", system), ChatMessage("user", "Tell me about the moon.")], 40)
        turn_ms.append(fin.timings.prefill_ms)  # type: ignore[attr-defined]
        tok_s.append(fin.timings.decode_tokens_per_s)  # type: ignore[attr-defined]
        engine.release(session)
    return {"turn_prefill_ms": statistics.median(turn_ms), "decode_tok_s": statistics.median(tok_s)}


def auto_choices(engine: Engine, system: str, specs: tuple, cases: list, show: bool = False) -> dict[str, object]:
    constraint = call_constraint(specs, "auto", parallel=False)
    right, unwanted = 0, []
    for question, wanted, _ in cases:
        messages = [ChatMessage("system", system), ChatMessage("user", question)]
        text, _ = _run(engine, "auto", messages, 80, constraint)
        if show:
            print(f"  {question!r} -> {text!r}")
        parser = CallParser(lambda: "call")
        parser.feed(text)
        parser.close()
        names = [c.name for c in parser.calls]
        right += int(wanted is not None and names[:1] == [wanted])
        if wanted is None and names:
            unwanted.append(question)
    engine.release("auto")
    return {"wanted": sum(1 for c in cases if c[1]), "right_tool": right, "no_tool": sum(1 for c in cases if not c[1]),
            "unwanted": len(unwanted), "unwanted_questions": unwanted}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a .gguf or HF folder (default: the embedded SmolLM2)")
    p.add_argument("--quant", default="none", choices=("none", "int8", "int4"),
                   help="weights as the engine keeps them (default none; int4 as `parley serve` runs)")
    p.add_argument("--tiny", action="store_true", help="4 questions, 1 round (the test's form)")
    p.add_argument("--out", help="write the numbers as JSON here")
    p.add_argument("--show", action="store_true", help="print each question's reply")
    args = p.parse_args()
    from bench.llm_speed import llm_path
    from llm_engine.threads import on_own_thread

    path = llm_path(args.model)
    engine = on_own_thread(lambda: Engine.from_path(path, max_seq_len=2048, max_slots=4, quant=args.quant))
    warm(engine.tokenizer)
    bridge = LlmBridge(engine)
    base, tooled, specs = persona_prompts(bridge.system_with_tools)  # as a session words them (the family's record)
    wordings = {"our prompt format": persona_prompts()[1]}
    template = persona_prompts(engine.tokenizer.system_with_tools)[1]
    if template != wordings["our prompt format"]:
        wordings["the template's wording"] = template
    cases = [CASES[0], CASES[6], CASES[14], CASES[20]] if args.tiny else CASES
    tokens = {k: len(engine.tokenizer.apply_chat_template([ChatMessage("system", s), ChatMessage("user", "Hi")]))
              for k, s in (("without", base), ("with", tooled))}  # fmt: skip
    engine.start()
    try:
        cost = {k: turn_cost(engine, s, 1 if args.tiny else 5) for k, s in (("without", base), ("with", tooled))}
        auto = {k: auto_choices(engine, s, specs, cases, show=args.show) for k, s in wordings.items()}
    finally:
        engine.stop()
    support = llm_tool_support(bridge)
    print(f"\nThe assistant persona on {path.name}, without / with the default tools in its prompt")
    for k in ("without", "with"):
        print(f"{k:>8}: prompt {tokens[k]} tokens, a turn's prefill (cache reused) {cost[k]['turn_prefill_ms']:.0f} ms, "
              f"decode {cost[k]['decode_tok_s']:.1f} tok/s")  # fmt: skip
    for k, a in auto.items():
        used = " (a session's)" if wordings[k] == tooled else ""
        print(f"tool_choice auto, the persona's prompt, the tools in {k}{used}: right tool {a['right_tool']}/{a['wanted']}, "
              f"calls when none was wanted {a['unwanted']}/{a['no_tool']}")  # fmt: skip
    print(f"tools: auto (the default) offers on this model: {'the default tools' if support.can_call else 'none'} "
          f"({support.why})")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"tokens": tokens, "cost": cost, "auto": auto, "requests": len(cases),
                       "auto_offers_tools": support.can_call, "why": support.why}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
