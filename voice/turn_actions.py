"""What turn-taking asks its shell to do: the actions voice.turntaking returns, one frozen dataclass each.

Pure values, no behaviour; voice.session runs them (docs/turn-taking.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from voice.turn_policy import TurnCheck


@dataclass(frozen=True)
class OpenTurn:
    turn_id: int
    start_ms: float  # audio time of the first voiced sample
    during_reply: bool  # an interjection (under a reply, or right after an endpoint): a turn only if it interrupts
    joins: int | None = None  # the ended turn whose request this speech may continue (confirmed by Join)
    holds: int | None = None  # the reply whose playback pauses now, until a Release or an Interrupt


@dataclass(frozen=True)
class Recognise:
    """Speech that may interrupt: recognise its words so far; answer with interjection_heard(turn_id, n, ...)."""

    turn_id: int
    n: int


@dataclass(frozen=True)
class Join:
    """The speech after an endpoint continues that request: its audio and transcript now hold the whole of it."""

    turn_id: int
    joins: int


@dataclass(frozen=True)
class Release:
    """The speech that held a reply was no interruption: playback resumes where it paused."""

    reply_turn: int
    turn_id: int  # the interjection
    t_ms: float  # audio time of the decision
    reason: str  # none | backchannel | echo | unsure (held as long as it may be)
    heard: str = ""  # the interjection's words, as the last recognition had them


@dataclass(frozen=True)
class StartAhead:
    """The user paused: recognise the audio so far and prefill the engine while the pause lasts."""

    turn_id: int


@dataclass(frozen=True)
class DropAhead:
    """Speech came back: what was computed ahead is stale."""

    turn_id: int


@dataclass(frozen=True)
class CheckTurn:
    turn_id: int
    check: int  # numbers the turn's checks; answer with check_done(turn_id, check, ...)
    silence_ms: float


@dataclass(frozen=True)
class EndTurn:
    turn_id: int
    speech_end_ms: float  # audio time of the end of the last voiced frame
    reason: str  # "silence" (fixed hangover) | "complete" (a check) | "max_hangover" | "max_length"
    checks: tuple[TurnCheck, ...]
    joins: int | None


@dataclass(frozen=True)
class DropTurn:
    """Speech under a reply that never barged in (a cough, a backchannel): not a turn."""

    turn_id: int
    speech_end_ms: float


@dataclass(frozen=True)
class Interrupt:
    turn_id: int  # whose reply stops now: its queued audio is dropped and the client told to drop its own
    t_ms: float | None  # for speech that interrupts: the audio time that decided it
    reason: str  # "barge_in" | "rejoin" | "replaced" | "cancel"


@dataclass(frozen=True)
class Reply:
    turn_id: int
    text: str | None  # what the user said or typed; None for a greeting
    kind: str  # "voice" | "text" | "greeting"


@dataclass(frozen=True)
class Correct:
    """A playback mark for the reply interrupted last: the history keeps what was heard up to `played_ms`."""

    turn_id: int
    played_ms: float


Action = OpenTurn | StartAhead | DropAhead | CheckTurn | Recognise | EndTurn | DropTurn | Join | Interrupt | Release | Reply | Correct
