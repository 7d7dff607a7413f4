"""The end-of-turn text probe's calibration for a model: P(the user's text ends here) on the corpus's whole requests
and on the first halves of its paused ones, and the even-odds point that fits them best (llm_engine/families.py
keeps it per model family; voice.turn_policy reads the probe as odds against it).

`python -m bench.text_probe [--models embedded-135m,embedded-0.5b,...] [--persona assistant]`
The fit: with P(complete) = p / (p + even) (the policy's own form), the `even` that maximises the likelihood of the
labels (whole: complete; first half: not), found on a log grid. It prints medians, the fit, and how many texts
each side of it falls on the wrong side.
"""
from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import yaml

from bench.corpus import PAUSED_REQUESTS, REQUESTS


def labelled_texts() -> list[tuple[str, bool]]:
    """(text, complete): every whole request and paused request joined (complete), every first half (not)."""
    whole = [*REQUESTS, *(f"{a} {b}" for a, b in PAUSED_REQUESTS)]
    return [*((t, True) for t in whole), *((a, False) for a, _ in PAUSED_REQUESTS)]


def fit_even_odds(probs: list[float], labels: list[bool]) -> float:
    """The `even` maximising sum log P(label) under P(complete) = p / (p + even), on a grid 1e-5..1 (200 steps a
    decade is finer than the probe's noise)."""
    def loglik(even: float) -> float:
        return sum(math.log((p if y else even) / (p + even)) for p, y in zip((max(p, 1e-12) for p in probs), labels))

    grid = [10 ** (-5 + i / 200) for i in range(0, 1001)]
    return max(grid, key=loglik)


def probe_all(source: str, system: str) -> list[float]:
    from llm_engine.engine import Engine
    from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
    from parley.locate import resolve

    engine = Engine.from_path(resolve("llm", source), quant="int4", max_seq_len=1024, max_slots=2)
    engine.start()
    try:
        out = []
        for i, (text, _) in enumerate(labelled_texts()):
            msgs = (ChatMessage("system", system), ChatMessage("user", text))
            req = GenerateRequest(f"p{i}", msgs, SamplingParams(max_new_tokens=0), probe_user_end=True)
            *_, fin = engine.submit(req).collect()
            engine.release(f"p{i}")
            out.append(float(fin.end_prob) if fin.end_prob is not None else float("nan"))
        return out
    finally:
        engine.stop()


def main() -> None:
    from parley.config import DEFAULT_CONFIG

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="embedded-135m,embedded-0.5b,embedded-1.5b")
    ap.add_argument("--persona", default="assistant")
    args = ap.parse_args()
    system = yaml.safe_load((Path(DEFAULT_CONFIG).parent / "personas" / f"{args.persona}.yaml").read_text())["system_prompt"]
    labels = [y for _, y in labelled_texts()]
    print(f"| model | whole requests: median P(end) | first halves: median | fitted even odds | whole below it | halves above it |")
    print("|---|---|---|---|---|---|")
    for source in args.models.split(","):
        probs = probe_all(source, system)
        whole = [p for p, y in zip(probs, labels) if y]
        half = [p for p, y in zip(probs, labels) if not y]
        even = fit_even_odds(probs, labels)
        print(f"| {source} | {statistics.median(whole):.3f} | {statistics.median(half):.4f} | {even:.4f} | "
              f"{sum(p < even for p in whole)} of {len(whole)} | {sum(p > even for p in half)} of {len(half)} |", flush=True)


if __name__ == "__main__":
    main()
