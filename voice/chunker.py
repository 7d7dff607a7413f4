"""Phrase chunker: turns a stream of LLM text deltas into speakable phrases for TTS.

A pure core over strings: the first phrase comes early (first clause, or about six words, never more
than eight), later ones at sentence ends; markdown, emoji and code fences are dropped. No audio, no I/O.
"""
from __future__ import annotations

import re

# Period-final words that do not end a sentence.
ABBREVIATIONS = frozenset(
    {"dr.", "mr.", "mrs.", "ms.", "prof.", "st.", "sr.", "jr.", "vs.", "etc.", "e.g.", "i.e.", "a.m.", "p.m.",
     "no.", "approx.", "fig.", "mt.", "ft.", "inc.", "ltd.", "co.", "dept.", "est."}
)  # fmt: skip
# Words a phrase should rather start with than end on, for the ~6-word first cut.
_BREAK_BEFORE = frozenset(
    {"and", "but", "or", "so", "because", "which", "that", "to", "with", "for", "in", "on", "at", "of", "if",
     "when", "while", "about", "from", "by", "as", "than", "then", "the", "a", "an"}
)  # fmt: skip
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f1e6-\U0001f1ff\U00002b00-\U00002bff\ufe0f\u200d\u20e3]"
)
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)?")  # "[text](url)" -> "[text" once split at spaces
_LINE_MARKER = re.compile(r"^(#{1,6}|[-*+>]|\d{1,3}[.)])$")  # heading, bullet, quote, numbered list
_CLOSERS = "\"')]}’”»"
_SENTENCE_END = re.compile(r"([.!?…]+)$")
_CLAUSE_END = re.compile(r"[,;:]$")
_INITIALS = re.compile(r"^([a-z]\.)+$")  # "J." "U.S."


def _clean_word(token: str) -> str:
    word = _EMOJI.sub("", token)
    word = _LINK_TARGET.sub("", word).replace("**", "").replace("__", "").replace("*", "").replace("`", "")
    word = word.lstrip("[_~").rstrip("]").replace("~~", "")
    word = re.sub(r"_+(?=[.,;:!?]*$)", "", word)  # closing _italic_ marker
    return word.strip()


def _bare(word: str) -> str:
    return word.rstrip(_CLOSERS)


def _ends_sentence(word: str) -> bool:
    bare = _bare(word)
    if not _SENTENCE_END.search(bare):
        return False
    low = bare.lower()
    return not (low in ABBREVIATIONS or (low.endswith(".") and _INITIALS.match(low) and not low.endswith("..")))


def _ends_clause(word: str) -> bool:
    return bool(_CLAUSE_END.search(_bare(word))) or word in {"—", "–", "-"} or word.endswith("—")


class PhraseChunker:
    """`push(delta)` returns the phrases completed by it; `flush()` returns what is left at the end.

    First phrase: ends at the first sentence end, or at a clause mark (, ; : —) once it has
    `min_clause_words`, or else after `first_words` words, cut just before a function word
    ("and", "to", "the", ...) among the last three so it does not end mid-thought. It never holds
    more than `first_words` (default 6, at most 8) words. Later phrases end at sentence ends or line
    breaks; a run-on sentence is cut at a clause mark after `max_words`, or hard at `2 * max_words`.
    A word is only judged once whitespace follows it, so "Dr." "3.5" and "10:30" stay whole.
    """

    def __init__(self, first_words: int = 6, min_clause_words: int = 2, max_words: int = 30) -> None:
        if not 1 <= first_words <= 8:
            raise ValueError("first_words must be between 1 and 8")
        self.first_words = first_words
        self.min_clause_words = min_clause_words
        self.max_words = max_words
        self.reset()

    def reset(self) -> None:
        self._raw = ""  # text whose last token may still be growing
        self._words: list[str] = []  # cleaned words of the phrase being built
        self._emitted = 0
        self._in_fence = False
        self._line_start = True

    def push(self, delta: str) -> list[str]:
        self._raw += delta
        # Only tokens followed by whitespace are complete; the tail waits for the next delta.
        parts = re.split(r"(\s+)", self._raw)
        self._raw = parts[-1]
        out: list[str] = []
        for part in parts[:-1]:
            if not part:
                continue
            if part.isspace():
                if "\n" in part:
                    self._end_line(out)
                continue
            self._add_token(part, out)
        return out

    def flush(self) -> list[str]:
        out: list[str] = []
        if self._raw:
            self._add_token(self._raw, out)
            self._raw = ""
        self._emit(len(self._words), out)
        self._in_fence = False
        self._line_start = True
        return out

    def _end_line(self, out: list[str]) -> None:
        self._line_start = True
        if not self._in_fence:
            self._emit(len(self._words), out)  # a heading or list item is its own phrase

    def _add_token(self, token: str, out: list[str]) -> None:
        line_start, self._line_start = self._line_start, False
        if token.startswith("```"):
            # a fence marker toggles; "```x```" opens and closes in one token
            if token.count("```") % 2 == 1:
                self._in_fence = not self._in_fence
                self._emit(len(self._words), out)
            return
        if self._in_fence or (line_start and _LINE_MARKER.match(token)):
            return
        word = _clean_word(token)
        if not word or not any(c.isalnum() for c in word) and not _ends_sentence(word):
            return
        if not any(c.isalnum() for c in word):  # stray "." or "!" left by a dropped emoji: close the phrase
            if self._words:
                self._words[-1] += word
                self._check(out)
            return
        self._words.append(word)
        self._check(out)

    def _check(self, out: list[str]) -> None:
        word, n = self._words[-1], len(self._words)
        if _ends_sentence(word):
            self._emit(n, out)
        elif self._emitted == 0:
            if _ends_clause(word) and n >= self.min_clause_words:
                self._emit(n, out)
            elif n >= self.first_words:
                self._emit(self._first_cut(), out)
        elif n >= self.max_words and _ends_clause(word) or n >= 2 * self.max_words:
            self._emit(n, out)

    def _first_cut(self) -> int:
        """How many words the first phrase keeps: cut before the last function word in the last three."""
        n = len(self._words)
        for i in range(n - 1, max(n - 4, 1), -1):
            if _bare(self._words[i]).lower().strip(",;:") in _BREAK_BEFORE:
                return i
        return n

    def _emit(self, n: int, out: list[str]) -> None:
        if n <= 0:
            return
        phrase = " ".join(self._words[:n])
        del self._words[:n]
        out.append(phrase)
        self._emitted += 1
