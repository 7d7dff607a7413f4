"""The preemptive first phrase: whether a reply's first phrase is decoded and synthesised during the user's pause,
held until the endpoint, and then spoken at once, dropped, or shed (pure: no clock, no I/O, no models).

It follows voice.turntaking's actions (a resume drops the held phrase, a check that says "not finished" keeps it,
the reply to the same words uses it) and the work ahead's results; voice.first_phrase runs what it asks for.
Outcomes, per answered voice turn (the turn trace's `preemptive`): hit (ready at the endpoint), miss (not ready
then: still running, or never started), shed (skipped: the machine was busy), dropped (the held work was thrown
away: speech came back, or the words changed). docs/turn-taking.md, Preemptive first phrase.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from voice.turntaking import Action, DropAhead, DropTurn, EndTurn, Join, Reply


@dataclass(frozen=True)
class StartPhrase:
    """Decode the reply to `text` up to its first phrase, synthesise that phrase, hold both."""

    turn_id: int
    text: str


@dataclass(frozen=True)
class DropPhrase:
    """The held work is stale: cancel its decode and synthesis, count what was computed as wasted."""

    turn_id: int
    reason: str  # resumed | words | joined | not_a_turn | no_reply | replaced


@dataclass(frozen=True)
class UsePhrase:
    """The reply to the words the held phrase was made for starts now: it continues the held work."""

    turn_id: int
    outcome: str  # hit | miss


@dataclass(frozen=True)
class ShedPhrase:
    """The machine is busy: no work ahead past the prefill for this pause (the turn runs as without preemption)."""

    turn_id: int
    reason: str


PreAction = StartPhrase | DropPhrase | UsePhrase | ShedPhrase


@dataclass
class _Held:
    turn_id: int
    text: str
    ready: bool = False  # decoded and synthesised
    ready_at_endpoint: bool | None = None  # known at the endpoint


class Preemption:
    """One session's preemptive first phrase: at most one held at a time, for the turn being heard or just ended."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._held: _Held | None = None
        self._outcome: dict[int, str] = {}  # turn -> shed | dropped, until the turn's reply says more

    @property
    def held(self) -> int | None:
        """The turn whose phrase is held (or being made), if any."""
        return None if self._held is None else self._held.turn_id

    @property
    def ready(self) -> bool:
        """Whether a phrase is held and made (decoded and synthesised)."""
        return self._held is not None and self._held.ready

    def ahead_ready(self, turn_id: int, text: str, busy: str | None) -> list[PreAction]:
        """The work ahead has the final transcript and the prefill of the turn being heard, in a pause that still
        lasts. `busy`: why the machine cannot spare the work now, or None."""
        if not self.enabled or not text.strip():
            return []
        held = self._held
        if held is not None and held.turn_id == turn_id and held.text == text:
            return []  # the same words again: what is held (or being made) still answers them
        out: list[PreAction] = self._drop("words" if held is not None and held.turn_id == turn_id else "replaced")
        if busy is not None:
            self._outcome[turn_id] = "shed"
            return [*out, ShedPhrase(turn_id, busy)]
        self._held = _Held(turn_id, text)
        return [*out, StartPhrase(turn_id, text)]

    def phrase_ready(self, turn_id: int) -> None:
        """The held phrase is decoded and its audio made."""
        if self._held is not None and self._held.turn_id == turn_id:
            self._held.ready = True

    def failed(self, turn_id: int) -> None:
        """Its work failed or was cancelled: nothing is held (the reply runs as without preemption)."""
        if self._held is not None and self._held.turn_id == turn_id:
            self._held = None

    def no_reply(self, turn_id: int) -> list[PreAction]:
        """The ended turn gets no reply (no words, or replies are asked for explicitly): its held work goes."""
        self._outcome.pop(turn_id, None)
        return self._drop("no_reply") if self.held == turn_id else []

    def outcome(self, turn_id: int) -> str | None:
        """For the turn's trace, once its reply started: hit | miss | shed | dropped (None: preemption is off)."""
        return self._outcome.pop(turn_id, None) if self.enabled else None

    def follow(self, actions: Sequence[Action]) -> list[PreAction]:
        """What turn-taking decided, in order -> what that means for the held phrase."""
        out: list[PreAction] = []
        for a in actions:
            held = self._held
            if isinstance(a, DropAhead) and held is not None and held.turn_id == a.turn_id:
                out += self._drop("resumed")
            elif isinstance(a, DropTurn) and held is not None and held.turn_id == a.turn_id:
                out += self._drop("not_a_turn")
            elif isinstance(a, Join) and held is not None and held.turn_id == a.joins:
                out += self._drop("joined")
            elif isinstance(a, EndTurn) and held is not None and held.turn_id == a.turn_id:
                held.ready_at_endpoint = held.ready
            elif isinstance(a, Reply):
                out += self._reply(a)
        return out

    def _reply(self, a: Reply) -> list[PreAction]:
        held = self._held
        if held is None or held.turn_id != a.turn_id:
            if a.kind == "voice" and self.enabled:
                self._outcome.setdefault(a.turn_id, "miss")  # nothing held: shed, dropped, or the pause was too short
            return self._drop("replaced") if held is not None else []
        if a.kind != "voice" or a.text != held.text:
            return self._drop("words")
        self._held = None
        outcome = "hit" if held.ready_at_endpoint else "miss"
        self._outcome[a.turn_id] = outcome
        return [UsePhrase(a.turn_id, outcome)]

    def _drop(self, reason: str) -> list[PreAction]:
        held = self._held
        if held is None:
            return []
        self._held = None
        self._outcome[held.turn_id] = "dropped"
        return [DropPhrase(held.turn_id, reason)]
