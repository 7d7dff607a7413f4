"""Per-turn latency as the client sees it: the server's stage times plus mic-to-ear time.

mic-to-ear = when the first reply sample reaches the speaker minus when the user's last voiced
sample was captured, both on this machine's perf_counter clock. Pure; knows no sockets or devices.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from desktop.echo import level_dbfs


class VoicedClock:
    """A small energy detector over microphone blocks: remembers when voice was last heard.
    The threshold follows the noise floor (fast down, slow up) so a fan does not count as voice."""

    def __init__(self, min_dbfs: float = -45.0, above_floor_db: float = 12.0) -> None:
        self.min_dbfs = min_dbfs
        self.above_floor_db = above_floor_db
        self.floor_dbfs = -90.0
        self.last_voiced_end_s: float | None = None

    def update(self, block: np.ndarray, capture_s: float, sample_rate: int) -> bool:
        level = level_dbfs(block)
        self.floor_dbfs = level if level < self.floor_dbfs else self.floor_dbfs + 0.05 * (level - self.floor_dbfs)
        voiced = level > max(self.min_dbfs, self.floor_dbfs + self.above_floor_db)
        if voiced:
            self.last_voiced_end_s = capture_s + len(block) / sample_rate
        return voiced


@dataclass(frozen=True)
class TurnLatency:
    turn_id: int
    user_text: str = ""
    stages_ms: dict[str, float] = field(default_factory=dict)
    over_budget: tuple[str, ...] = ()
    speech_end_s: float | None = None
    playback_start_s: float | None = None
    interrupted: bool = False
    client_playback_ms: float | None = None  # first audio arrival to first sample at the speaker (output latency in)
    output_latency_ms: float | None = None  # of that, what the output device reports as its own latency
    underruns: int = 0  # times the reply ran dry part-way and rebuffered

    @property
    def mic_to_ear_ms(self) -> float | None:
        if self.speech_end_s is None or self.playback_start_s is None:
            return None
        return (self.playback_start_s - self.speech_end_s) * 1000.0


class LatencyBook:
    """Collects each turn's row as its messages arrive, in any order."""

    def __init__(self) -> None:
        self._rows: dict[int, TurnLatency] = {}
        self.budgets_ms: dict[str, float] = {}
        self._pending_speech_end_s: float | None = None

    def _row(self, turn_id: int) -> TurnLatency:
        return self._rows.setdefault(turn_id, TurnLatency(turn_id))

    def speech_ended(self, voiced_end_s: float | None) -> None:
        """The server says the user stopped; pin the last voiced capture time for the next turn."""
        self._pending_speech_end_s = voiced_end_s

    def on_final(self, turn_id: int, text: str) -> None:
        self._rows[turn_id] = replace(self._row(turn_id), user_text=text, speech_end_s=self._pending_speech_end_s)
        self._pending_speech_end_s = None

    def on_typed(self, turn_id: int, text: str) -> None:
        self._rows[turn_id] = replace(self._row(turn_id), user_text=text)

    def on_playback_start(self, turn_id: int, at_s: float, client_playback_ms: float | None = None,
                          output_latency_ms: float | None = None, underruns: int = 0) -> None:
        row = self._row(turn_id)
        if row.playback_start_s is None:
            row = replace(row, playback_start_s=at_s, client_playback_ms=client_playback_ms,
                          output_latency_ms=output_latency_ms)
        self._rows[turn_id] = replace(row, underruns=underruns)

    def on_trace(self, turn_id: int, stages_ms: dict[str, float], budgets_ms: dict[str, float],
                 over_budget: list[str]) -> None:
        self.budgets_ms.update(budgets_ms)
        self._rows[turn_id] = replace(self._row(turn_id), stages_ms=dict(stages_ms), over_budget=tuple(over_budget))

    def on_done(self, turn_id: int, interrupted: bool) -> None:
        self._rows[turn_id] = replace(self._row(turn_id), interrupted=interrupted)

    def get(self, turn_id: int) -> TurnLatency | None:
        return self._rows.get(turn_id)

    def rows(self) -> list[TurnLatency]:
        return [self._rows[k] for k in sorted(self._rows)]
