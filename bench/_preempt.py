"""The preemptive first phrase in a bench's turns (voice/first_phrase.py): how often it was ready at the endpoint, missed,
shed for load or dropped, and the work it threw away, from the turn traces' `preemptive` fields."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

OUTCOMES = ("hit", "miss", "shed", "dropped")


def summary(traces: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """-> {hit, miss, shed, dropped: turns; turns: voice turns with the field; wasted_tokens / wasted_tts_ms: in all
    and per turn}. Turns without the field (preemption off, typed) count nowhere."""
    counts: Counter[str] = Counter()
    tokens, tts_ms, n = 0, 0.0, 0
    for trace in traces:
        if not trace or "preemptive" not in trace:
            continue
        n += 1
        counts[str(trace["preemptive"])] += 1
        waste = trace.get("preemptive_waste") or {}
        tokens += int(waste.get("tokens", 0))
        tts_ms += float(waste.get("tts_ms", 0.0))
    per = max(1, n)
    return {**{o: counts[o] for o in OUTCOMES}, "turns": n, "wasted_tokens": tokens, "wasted_tts_ms": round(tts_ms, 1),
            "wasted_tokens_per_turn": round(tokens / per, 2), "wasted_tts_ms_per_turn": round(tts_ms / per, 1)}  # fmt: skip


def line(s: dict[str, Any]) -> str:
    if not s["turns"]:
        return "Preemptive first phrase: off (no turn traced it)"
    return (f"Preemptive first phrase over {s['turns']} turns: " + ", ".join(f"{o} {s[o]}" for o in OUTCOMES)
            + f"; wasted {s['wasted_tokens']} tokens ({s['wasted_tokens_per_turn']}/turn), "
            f"{s['wasted_tts_ms']} synthesis ms ({s['wasted_tts_ms_per_turn']}/turn)")
