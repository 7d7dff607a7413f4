"""Numbers from turn results: median/p95 per stage, budget violations, and the plain-text tables both
benchmarks print. Pure: takes TurnResult lists and budget dicts, does no I/O beyond `print` in `table`.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench._client import TurnResult
from voice.trace import STAGES as TRACE_STAGES

STAGES = tuple(TRACE_STAGES)  # the trace's own stage names, voice_to_voice last
CLIENT_V2V = "client_v2v"  # client clock: last voiced sample sent -> first reply audio received


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


GAP_MS = 100.0  # a stall in a reply's speech that a listener hears as a break


def reply_gaps(turns: Iterable[TurnResult]) -> dict[str, float | int]:
    """Replies whose speech stalled (audio arriving after what had come played out) for GAP_MS or more."""
    gaps = [t.reply_gap_ms for t in turns if t.error is None]
    return {"stalled": sum(g >= GAP_MS for g in gaps), "max_ms": max(gaps, default=0.0)}


def stage_values(turns: Iterable[TurnResult]) -> dict[str, list[float]]:
    """Every stage's values over the turns that have a trace, plus the client-side voice-to-voice."""
    out: dict[str, list[float]] = {s: [] for s in (*STAGES, CLIENT_V2V)}
    for t in turns:
        if t.trace is not None:
            for stage, ms in t.trace.get("stages_ms", {}).items():
                out.setdefault(stage, []).append(float(ms))
        if t.client_v2v_ms is not None:
            out[CLIENT_V2V].append(t.client_v2v_ms)
    return out


def summarize(turns: Sequence[TurnResult], budgets_ms: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """stage -> {n, median, p95, max, budget, over}: `over` counts turns whose stage exceeded its budget."""
    summary: dict[str, dict[str, Any]] = {}
    for stage, values in stage_values(turns).items():
        budget = budgets_ms.get("voice_to_voice" if stage == CLIENT_V2V else stage)
        row: dict[str, Any] = {"n": len(values), "budget": budget}
        if values:
            row.update(median=percentile(values, 50), p95=percentile(values, 95), max=max(values))
            row["over"] = sum(v > budget for v in values) if budget is not None else 0
        summary[stage] = row
    return summary


def violations(turns: Iterable[TurnResult]) -> Counter[str]:
    """How many turns the server flagged over budget, per stage (the trace's own `over_budget`)."""
    return Counter(s for t in turns if t.trace is not None for s in t.trace.get("over_budget", []))


def holds_budget(row: Mapping[str, Any]) -> bool:
    """A stage holds its budget when it has values and its p95 is within it."""
    return row.get("n", 0) > 0 and row.get("budget") is not None and row["p95"] <= row["budget"]


def slowest_stage(summary: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The pipeline stage (not the voice_to_voice total) with the largest median."""
    medians = {s: summary[s]["median"] for s in STAGES[:-1] if summary.get(s, {}).get("n")}
    return max(medians, key=lambda s: medians[s]) if medians else None


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A left-aligned plain-text table with a rule under the header."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(str(c) for c in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def stage_rows(summary: Mapping[str, Mapping[str, Any]]) -> list[list[object]]:
    """Rows of stage, n, median, p95, max, budget, over for the tables."""
    rows: list[list[object]] = []
    for stage in (*STAGES, CLIENT_V2V):
        r = summary.get(stage, {})
        if not r.get("n"):
            continue
        rows.append([stage, r["n"], fmt_ms(r["median"]), fmt_ms(r["p95"]), fmt_ms(r["max"]),
                     fmt_ms(r.get("budget")), r.get("over", 0)])
    return rows


STAGE_HEADER = ("stage", "n", "median ms", "p95 ms", "max ms", "budget ms", "over")
