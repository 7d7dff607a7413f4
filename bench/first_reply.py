"""The first conversation after a start: its first reply, with the default persona's prompt pinned at start (as
shipped, parley.runtime.pin_persona_prompt) and without, beside how long loading and warming took.

Each row loads the stages as `parley serve` does (load_and_warm), then asks the default persona one question the way
a session's first turn asks it (system with its tools, the greeting, the question) straight at the engine.
Usage: HF_HUB_OFFLINE=1 .venv/bin/python -m bench.first_reply [--model embedded-1.5b] [--question TEXT]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def first_reply(model: str, question: str, pin: bool) -> dict[str, float]:
    from llm_engine.engine import ChatMessage, GenerateRequest, SamplingParams
    from parley import runtime as rt
    from parley.config import load_config
    from voice.tool_turn import with_tools

    cfg = load_config(None, [f"models.llm.source={model}"])
    real_pin = rt.pin_persona_prompt
    if not pin:
        rt.pin_persona_prompt = lambda runtime, cfg: None  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        runtime = rt.load_and_warm(cfg)
        load_s = time.perf_counter() - t0
    finally:
        rt.pin_persona_prompt = real_pin  # type: ignore[assignment]
    try:
        llm = runtime.stages.llm
        p = rt.persona_spec(cfg, cfg.default_persona, rt.llm_tool_support(llm))
        system = with_tools(p.system_prompt, p, native=llm.native_tools, wording=llm.system_with_tools)
        messages = (ChatMessage("system", system), ChatMessage("assistant", p.greeting or "Hi."), ChatMessage("user", question))
        t0 = time.perf_counter()
        events = list(runtime.engine.submit(GenerateRequest("first", messages, SamplingParams(max_new_tokens=8))))
        reply_s = time.perf_counter() - t0
        t = events[-1].timings
        return {"load_s": load_s, "reply_s": reply_s, "first_token_ms": t.first_token_ms, "prefill": t.prefill_tokens,
                "copied": t.reused_tokens}  # fmt: skip
    finally:
        runtime.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded", help="models.llm.source (default: embedded)")
    p.add_argument("--question", default="What is the capital of France?")
    args = p.parse_args()
    print(f"{args.model}: the first conversation's first reply after a start (8 tokens), the default persona")
    print(f"{'':22s} {'load+warm s':>12s} {'reply s':>9s} {'first token ms':>15s} {'prompt computed':>16s} {'copied':>7s}")
    for pin in (True, False):
        r = first_reply(args.model, args.question, pin)
        label = "pinned at start" if pin else "not pinned (before)"
        print(f"{label:22s} {r['load_s']:12.1f} {r['reply_s']:9.2f} {r['first_token_ms']:15.0f} {r['prefill']:16d} {r['copied']:7d}", flush=True)


if __name__ == "__main__":
    main()
