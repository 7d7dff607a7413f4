"""How a turn ends: the end-of-turn policy (config `vad.*`), how one check's signals combine into P(complete), and
the record of a check as the turn's trace keeps it. Pure values and arithmetic; voice.turntaking applies them.
The rules and their measurements: docs/turn-taking.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from voice.interjection import Lexicon

DETECTIONS = ("fixed", "smart_turn", "text", "combined")
INTERRUPTS_BY = ("words", "duration")

# The engine's text signal is P(the user's text could end right after its last word). On the pause corpus a half
# sentence scores ~0.01 and a whole request ~0.45 (medians) with SmolLM2-135M: this value counts as even odds of a
# finished turn. Each model's own comes from its family record (llm_engine.families), through the LLM stage.
TEXT_EVEN_ODDS = 0.03
# The audio model's scores seen on the turn corpus (454 checks, five voices) lay within this range (0.0067-0.9897):
# a text probability that gives the same wait at both ends of it needs no audio model (audio_can_change).
AUDIO_RANGE = (0.005, 0.995)


@dataclass(frozen=True)
class TurnPolicy:
    """How a turn ends. fixed: after `hangover_ms` of silence. smart_turn | text | combined: after
    `turn_check_ms` of silence a check asks the audio model, the engine's text probability or both; the turn
    ends at once when P(complete) >= sure_prob, waits up to `max_hangover_ms` of silence when it is <=
    unsure_prob, and in between waits a silence scaled on the log-odds between the two."""

    detection: str = "combined"
    min_speech_ms: float = 120.0  # voiced time before a turn starts
    ahead_silence_ms: float = 32.0  # silence before the work ahead starts: the recogniser hears the last word's tail
    hangover_ms: float = 500.0
    turn_check_ms: float = 160.0
    max_hangover_ms: float = 1000.0
    sure_prob: float = 0.8
    unsure_prob: float = 0.5
    audio_weight: float = 0.25  # combined: the audio model's log-odds count this much beside the text's
    text_even_odds: float = TEXT_EVEN_ODDS  # the text probe's even odds: the LLM's own (Session._usable sets it)
    # Speech under a reply (or right after an endpoint) holds the reply, and what it said decides: "words" stops the
    # reply only for a real interruption (voice.interjection); "duration" for any speech of barge_in_min_speech_ms.
    interrupt_by: str = "words"
    barge_in_min_speech_ms: float = 200.0  # duration: shorter speech under a reply (a cough, "uh-huh") is no turn
    interject_step_ms: float = 100.0  # words: new audio of a growing interjection between two recognitions
    interject_release_ms: float = 500.0  # words: speech this long with no words or only the reply's own resumes it
    interject_max_hold_ms: float = 1500.0  # words: the longest a reply is held for speech that has not interrupted
    lexicon: Lexicon = field(default_factory=Lexicon.of)  # words: backchannels and stop words
    rejoin_window_ms: float = 1000.0  # speech starting this soon after an endpoint continues that request; 0: off
    # ... unless it started this long after the reply to that request became audible (the client's first playback
    # mark): by then the user could hear it, and speech is about the reply, not more of the request (a slow machine's
    # late reply no longer turns "I see" into a continuation). Shorter: said before anyone could react to the reply.
    rejoin_react_ms: float = 250.0
    max_turn_ms: float = 30000.0  # a turn this long ends (a bound on one utterance's audio and transcript)

    def __post_init__(self) -> None:
        if self.detection not in DETECTIONS:
            raise ValueError(f"turn detection must be one of {DETECTIONS}, got {self.detection!r}")
        if not 0.0 < self.unsure_prob <= self.sure_prob < 1.0:
            raise ValueError(f"need 0 < unsure_prob <= sure_prob < 1, got {self.unsure_prob}, {self.sure_prob}")
        if self.interrupt_by not in INTERRUPTS_BY:
            raise ValueError(f"interrupt_by must be one of {INTERRUPTS_BY}, got {self.interrupt_by!r}")
        if not self.ahead_silence_ms <= self.turn_check_ms <= self.max_hangover_ms:
            raise ValueError("need ahead_silence_ms <= turn_check_ms <= max_hangover_ms")

    @property
    def uses_audio(self) -> bool:
        return self.detection in ("smart_turn", "combined")

    @property
    def uses_text(self) -> bool:
        return self.detection in ("text", "combined")

    def without_text(self) -> "TurnPolicy":
        """This policy for an LLM that gives no end-of-turn probability (a remote one): combined decides from the
        audio model alone (smart_turn), text from silence alone (fixed)."""
        if not self.uses_text:
            return self
        return replace(self, detection="smart_turn" if self.detection == "combined" else "fixed")

    def complete_prob(self, audio_prob: float | None, text_prob: float | None) -> float | None:
        """P(the turn is complete) from the signals this detection uses; None when none of them is known."""
        log_odds, known = 0.0, False
        if self.uses_text and text_prob is not None:
            log_odds += math.log(max(text_prob, 1e-12) / self.text_even_odds)
            known = True
        if self.uses_audio and audio_prob is not None:
            p = min(max(audio_prob, 1e-6), 1 - 1e-6)
            log_odds += (self.audio_weight if self.detection == "combined" else 1.0) * math.log(p / (1 - p))
            known = True
        return 1.0 / (1.0 + math.exp(-log_odds)) if known else None

    def audio_can_change(self, text_prob: float | None) -> bool:
        """Whether the audio model's score could change the wait, given the text's: not when every score in
        AUDIO_RANGE gives the same one (the wait is monotone in the score, so the range's ends decide): the text alone
        is sure enough to end at the check, or unsure enough to hold the longest. On the turn corpus that skips 196
        of 454 checks and changes none of their waits."""
        if not self.uses_audio:
            return False
        if not self.uses_text or text_prob is None:
            return True
        low, high = (self.wait_ms(self.complete_prob(a, text_prob)) for a in AUDIO_RANGE)
        return low != high

    def wait_ms(self, prob: float | None) -> float:
        """The silence after which a turn whose check gave `prob` ends."""
        if prob is None or prob <= self.unsure_prob:
            return self.max_hangover_ms
        if prob >= self.sure_prob:
            return self.turn_check_ms
        lo, hi, x = (math.log(p / (1 - p)) for p in (self.unsure_prob, self.sure_prob, prob))
        return self.max_hangover_ms - (x - lo) / (hi - lo) * (self.max_hangover_ms - self.turn_check_ms)


@dataclass(frozen=True)
class TurnCheck:
    """One end-of-turn check, as the turn's trace records it."""

    silence_ms: float  # silence when its result came in (unanswered: when the turn ended)
    audio_prob: float | None
    text_prob: float | None
    complete_prob: float | None
    wait_ms: float | None  # the silence it asked for before the turn ends; None for a stale or unanswered check
    cost_ms: float  # the check's own time (model run, waiting for the text probability); unanswered: waited so far
    decision: str  # "end" | "wait" | "stale" (speech came back before the result) | "unanswered" (the turn ended first)

    def to_dict(self) -> dict[str, object]:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        return {"silence_ms": round(self.silence_ms, 1), "audio_prob": r(self.audio_prob), "text_prob": r(self.text_prob),
                "complete_prob": r(self.complete_prob), "wait_ms": None if self.wait_ms is None else round(self.wait_ms, 1),
                "cost_ms": round(self.cost_ms, 1), "decision": self.decision}  # fmt: skip
