"""When the reply track's 20 ms frames go out: on a steady clock (frame n at start + n x 20 ms, so a late event
loop is caught up, never accumulated), a reply's audio up to `lead_s` ahead of it. A reply's start goes out in a
burst and sits in the receiver's buffer as a cushion against a late loop or a late packet; the silence between
replies pays the lead back. Pure arithmetic on the times it is given.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LEAD_MS = 120.0  # how far a reply may run ahead of real time (a barge-in costs the client up to this much more)


@dataclass
class Pacer:
    frame_s: float = 0.02
    lead_s: float = LEAD_MS / 1000.0
    _start_s: float | None = field(default=None, init=False)
    _frames: int = field(default=0, init=False)

    def due_s(self, now_s: float, audio: bool) -> float:
        """When the next frame should go out (at or before `now_s`: at once); `audio`: it carries a reply's
        audio (else silence, which keeps to the clock itself)."""
        if self._start_s is None:
            self._start_s = now_s
        nominal_s = self._start_s + self._frames * self.frame_s
        self._frames += 1
        return nominal_s - (self.lead_s if audio else 0.0)

    def ahead_s(self, now_s: float) -> float:
        """How far the frames sent so far run ahead of real time (negative: behind, a late loop)."""
        if self._start_s is None:
            return 0.0
        return self._start_s + self._frames * self.frame_s - now_s
