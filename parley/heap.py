"""The garbage collector in a serving process: what start-up loaded (the models' and libraries' ~250,000 Python
objects) frozen out of every later collection, and the collector's pauses counted for /metrics.

A full collection walks every tracked object with the GIL held: over a loaded server's heap it took 50-100 ms on
this 2-core machine, a stall of the event loop and of the engine thread's Python between steps, at a moment no one
chooses (python -m bench.gc_pause measures it). Frozen objects are skipped by every collection (gc.freeze);
garbage made later is still collected.
"""
from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field


@dataclass
class GcPauses:
    """A gc.callbacks hook: per generation, how many collections ran, their seconds in all and the longest."""

    count: list[int] = field(default_factory=lambda: [0, 0, 0])
    total_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _started: dict[int, float] = field(default_factory=dict)  # thread id -> perf_counter at "start"

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        key = threading.get_ident()
        if phase == "start":
            self._started[key] = time.perf_counter()
            return
        began = self._started.pop(key, None)
        gen = int(info.get("generation", 2))
        if began is None or not 0 <= gen <= 2:
            return
        took_s = time.perf_counter() - began
        self.count[gen] += 1
        self.total_s[gen] += took_s
        self.max_s[gen] = max(self.max_s[gen], took_s)

    def counters(self) -> dict[str, tuple[float, str]]:
        """For web.metrics (name: (value, help)): the full collections, which are the ones that stall."""
        return {
            "parley_gc_full_collections_total": (self.count[2], "Full (generation 2) garbage collections."),
            "parley_gc_full_pause_seconds_total": (round(self.total_s[2], 6), "Seconds the full collections held the GIL."),
            "parley_gc_pause_seconds_total": (round(sum(self.total_s), 6), "Seconds every garbage collection held the GIL."),
        }


_PAUSES = GcPauses()


def freeze_loaded() -> int:
    """After start-up: collect what loading left as garbage, then freeze the rest out of later collections, and
    count collections from now on. -> how many objects are frozen. Idempotent."""
    gc.collect()
    gc.freeze()
    if _PAUSES not in gc.callbacks:
        gc.callbacks.append(_PAUSES)
    return gc.get_freeze_count()


def pauses() -> GcPauses:
    return _PAUSES
