"""LocalAgreement-n: commits the words on which the last n hypotheses of a growing utterance agree.

A pure core over strings: no audio, no model, no asyncio. Committed words are only ever appended.
"""
from __future__ import annotations

import re

_PUNCT = re.compile(r"[^\w']+")


def _norm(word: str) -> str:
    # "there," and "There." are the same word heard twice; Whisper moves punctuation and case around
    return _PUNCT.sub("", word.lower())


class LocalAgreement:
    """Feed each re-decode of the utterance-so-far to `update`; it returns the newly committed words.

    A word is committed when the last `n` hypotheses share it within their longest common prefix
    (compared without case and punctuation) and it extends what is already committed. Once
    committed a word never changes or disappears: a later hypothesis that disagrees with the
    committed prefix simply commits nothing until the final decode.
    """

    def __init__(self, n: int = 2) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n
        self.reset()

    def reset(self) -> None:
        self._history: list[list[str]] = []  # last n hypotheses, as words
        self._committed: list[str] = []

    @property
    def committed(self) -> str:
        return " ".join(self._committed)

    @property
    def committed_words(self) -> tuple[str, ...]:
        return tuple(self._committed)

    def update(self, hypothesis: str) -> str | None:
        """Add one hypothesis; return the words it newly commits (joined by spaces) or None."""
        self._history.append(hypothesis.split())
        self._history = self._history[-self.n :]
        if len(self._history) < self.n:
            return None
        prefix = self._common_prefix(self._history)
        done = len(self._committed)
        if len(prefix) <= done or [_norm(w) for w in prefix[:done]] != [_norm(w) for w in self._committed]:
            return None
        new = prefix[done:]
        self._committed.extend(new)
        return " ".join(new)

    @staticmethod
    def _common_prefix(hypotheses: list[list[str]]) -> list[str]:
        """Longest common word prefix; surface forms come from the newest hypothesis."""
        newest = hypotheses[-1]
        length = min(len(h) for h in hypotheses)
        for i in range(length):
            if len({_norm(h[i]) for h in hypotheses}) != 1:
                return newest[:i]
        return newest[:length]
