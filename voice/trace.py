"""Per-turn latency trace (docs/protocol.md, Turn trace): marks on the monotonic clock, stages, budgets.

Each stage calls `mark()` at its own moment; nothing is reconstructed. Knows no sockets, files or metrics.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MARKS = (
    "speech_start",
    "speech_end",
    "endpoint",
    "asr_final",
    "llm_start",
    "llm_first_token",
    "tool_start",  # a tool call began (voice.tool_turn; the first, when a turn makes several)
    "tool_done",
    "first_phrase",
    "tts_first_audio",
    "first_audio_sent",
    "playback_start",
    "done",
    "interrupted",
)

# stage -> (from mark, to mark): stage = to - from, in ms
STAGES: dict[str, tuple[str, str]] = {
    "endpointing": ("speech_end", "endpoint"),
    "asr": ("endpoint", "asr_final"),
    "llm_ttft": ("llm_start", "llm_first_token"),
    "phrase": ("llm_first_token", "first_phrase"),
    "tts": ("first_phrase", "tts_first_audio"),
    "send": ("tts_first_audio", "first_audio_sent"),
    "tool": ("tool_start", "tool_done"),  # trace info "tools": each call's name, ms, ok (and error)
    "voice_to_voice": ("speech_end", "first_audio_sent"),
}


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class TurnTrace:
    """Marks of one user turn. The first call of `mark(name)` wins: a stage marks its own first moment."""

    turn_id: int
    session_id: str = ""
    budgets_ms: Mapping[str, float] = field(default_factory=dict)
    marks_ns: dict[str, int] = field(default_factory=dict)
    # facts that are not marks: ahead-of-endpoint savings, reused KV tokens, persona, input kind
    info: dict[str, Any] = field(default_factory=dict)
    # what was said and replied ("user", "reply"): never in to_dict (the log, the client); telemetry may opt in
    texts: dict[str, str] = field(default_factory=dict)

    def mark(self, name: str, t_ns: int | None = None) -> int:
        if name not in MARKS:
            raise ValueError(f"unknown trace mark {name!r}")
        return self.marks_ns.setdefault(name, now_ns() if t_ns is None else t_ns)

    def has(self, name: str) -> bool:
        return name in self.marks_ns

    @property
    def finished(self) -> bool:
        return "done" in self.marks_ns or "interrupted" in self.marks_ns

    def origin_ns(self) -> int:
        return min(self.marks_ns.values()) if self.marks_ns else 0

    def marks_ms(self) -> dict[str, float]:
        """Marks in ms after the turn's earliest mark, in MARKS order."""
        t0 = self.origin_ns()
        return {m: round((self.marks_ns[m] - t0) / 1e6, 3) for m in MARKS if m in self.marks_ns}

    def stages_ms(self) -> dict[str, float]:
        """Every stage whose two marks exist (asr may be negative when recognition ran ahead)."""
        out: dict[str, float] = {}
        for stage, (a, b) in STAGES.items():
            if a in self.marks_ns and b in self.marks_ns:
                out[stage] = round((self.marks_ns[b] - self.marks_ns[a]) / 1e6, 3)
        return out

    def over_budget(self) -> list[str]:
        stages = self.stages_ms()
        return [s for s in STAGES if s in stages and s in self.budgets_ms and stages[s] > self.budgets_ms[s]]

    def to_dict(self) -> dict[str, Any]:
        """The `turn.trace` message body (without `type`), also the trace-log line."""
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "marks_ms": self.marks_ms(),
            "stages_ms": self.stages_ms(),
            "budgets_ms": {k: float(v) for k, v in self.budgets_ms.items()},
            "over_budget": self.over_budget(),
            **self.info,
        }
