"""bench.quality's pure core: the question items, spelled-out numbers turned into digits, a reply's verdict, and the
tally per category. No model, no files: bench/quality.py reads the YAML and runs the engine.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen".split())}  # fmt: skip
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
# a spoken number's words may be joined by spaces or a hyphen ("twenty-seven"), nothing else: "one, two" stays two
_JOINER = re.compile(r"\s+|\s*-\s*")
_WORD = re.compile(r"[a-z]+")
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    question: str
    accept: tuple[tuple[str, ...], ...]  # alternatives; each term of one must appear in the reply
    reject: tuple[str, ...] = ()  # any of these in the reply makes it wrong (a reply naming two candidates)


@dataclass(frozen=True)
class _Number:
    start: int  # span in the lowered text
    end: int
    value: float
    pair_part: bool  # 11..99 said as one or two words: the half of a year said in pairs ("nineteen forty-five")


class _Reader:
    """Reads one spoken number word by word; `take` says whether a word continues it."""

    def __init__(self) -> None:
        self.total = 0  # the finished thousands / millions
        self.current = 0  # the part below the last scale word
        self.last = ""  # kind of the last word taken: unit, ten, hundred, scale, a, and
        self.scale = 10**12  # scales must fall: "two million three thousand", never "thousand million"

    @property
    def value(self) -> int:
        return self.total + self.current

    def take(self, word: str, following: str) -> bool:
        last, number_next = self.last, following in _UNITS or following in _TENS
        if word in _UNITS and (last in ("", "hundred", "scale", "and") or (last == "ten" and 0 < _UNITS[word] < 10)):
            self.current += _UNITS[word]
            self.last = "unit"
        elif word in _TENS and last in ("", "hundred", "scale", "and"):
            self.current += _TENS[word]
            self.last = "ten"
        elif word == "hundred" and last in ("unit", "ten", "a") and self.current < 100:
            self.current *= 100  # "twelve hundred", "thirty-six hundred"
            self.last = "hundred"
        elif word in _SCALES and last in ("unit", "ten", "hundred", "a") and _SCALES[word] < self.scale:
            self.total += self.current * _SCALES[word]
            self.current, self.scale, self.last = 0, _SCALES[word], "scale"
        elif word == "a" and last == "" and (following == "hundred" or following in _SCALES):
            self.current, self.last = 1, "a"
        elif word == "and" and last in ("hundred", "scale") and number_next:
            self.last = "and"  # "one hundred and twenty"
        else:
            return False
        return True


def _read_numbers(low: str) -> list[_Number]:
    """Every spoken number in lowered text, left to right, with its span."""
    words = list(_WORD.finditer(low))
    found: list[_Number] = []
    i = 0
    while i < len(words):
        reader, j, end = _Reader(), i, words[i].start()
        while j < len(words):
            if j > i and not _JOINER.fullmatch(low[words[j - 1].end() : words[j].start()]):
                break
            following = words[j + 1].group() if j + 1 < len(words) else ""
            if not reader.take(words[j].group(), following):
                break
            if reader.last not in ("a", "and"):  # a number never ends on "a" or "and"
                end = words[j].end()
            j += 1
        taken = [w for w in words[i:j] if w.end() <= end]
        if not taken:
            i += 1
            continue
        value: float = reader.value
        after = words[i + len(taken) : i + len(taken) + 3]
        if [w.group() for w in after[:3]] == ["and", "a", "half"] and _spaced(low, taken[-1], *after):
            value, end = value + 0.5, after[2].end()  # "two and a half"
            taken = taken + after
        pair = 11 <= value <= 99 and len(taken) <= 2 and value == int(value)
        found.append(_Number(taken[0].start(), end, value, pair))
        i += len(taken)
    return _join_pairs(low, found)


def _spaced(low: str, *words: re.Match[str]) -> bool:
    return all(low[a.end() : b.start()].isspace() for a, b in zip(words, words[1:]))


def _join_pairs(low: str, numbers: list[_Number]) -> list[_Number]:
    """A year said in pairs, "nineteen forty-five", is one number (1945), not 19 and 45."""
    out: list[_Number] = []
    for n in numbers:
        prev = out[-1] if out else None
        if prev and prev.pair_part and n.pair_part and 10 <= n.value and low[prev.end : n.start].isspace():
            out[-1] = _Number(prev.start, n.end, prev.value * 100 + n.value, False)
        else:
            out.append(n)
    return out


def normalise_numbers(text: str) -> str:
    """Lowered text with spelled-out numbers as digits and no thousands separators:
    "One hundred and twenty minutes, or 7,200 seconds" -> "120 minutes, or 7200 seconds"."""
    low = _THOUSANDS_COMMA.sub("", text.lower())
    parts, at = [], 0
    for n in _read_numbers(low):
        parts += [low[at : n.start], f"{n.value:g}" if n.value != int(n.value) else str(int(n.value))]
        at = n.end
    return "".join(parts) + low[at:]


def _term_pattern(term: str) -> re.Pattern[str]:
    norm = normalise_numbers(term).strip()
    if re.fullmatch(r"\d+(\.\d+)?", norm):  # a number: not part of a longer one ("20" is not in "120" or "1.20")
        return re.compile(rf"(?<![\d.]){re.escape(norm)}(?!\.?\d)")
    words = r"\s+".join(re.escape(w) for w in norm.split())
    return re.compile(rf"(?<!\w){words}(?!\w)")


def mentions(reply: str, term: str) -> bool:
    """Whether the reply says the term as a whole word or number, numbers in digits or words alike."""
    return _term_pattern(term).search(normalise_numbers(reply)) is not None


def score(reply: str, item: Question) -> bool:
    """Right: every term of one accepted alternative is in the reply, and no rejected word is."""
    if any(mentions(reply, r) for r in item.reject):
        return False
    return any(all(mentions(reply, t) for t in alt) for alt in item.accept)


def parse_questions(data: Any) -> tuple[Question, ...]:
    """The question file's list of mappings -> Questions; ValueError names the first bad item."""
    if not isinstance(data, list) or not data:
        raise ValueError("the question file must be a non-empty list")
    items, seen = [], set()
    for i, raw in enumerate(data):
        where = f"item {i} ({raw.get('id') if isinstance(raw, dict) else raw!r})"
        if not isinstance(raw, dict) or set(raw) - {"id", "category", "question", "accept", "reject"}:
            raise ValueError(f"{where}: a mapping of id, category, question, accept and optional reject")
        if not all(isinstance(raw.get(k), str) and raw[k].strip() for k in ("id", "category", "question")):
            raise ValueError(f"{where}: id, category and question must be non-empty strings")
        accept = raw.get("accept")
        if not isinstance(accept, list) or not accept or not all(isinstance(a, list) and a for a in accept):
            raise ValueError(f"{where}: accept must be a non-empty list of non-empty lists")
        if raw["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(raw["id"])
        items.append(Question(raw["id"], raw["category"], raw["question"], tuple(tuple(str(t) for t in a) for a in accept),
                              tuple(str(r) for r in raw.get("reject", ()))))  # fmt: skip
    return tuple(items)


def by_category(verdicts: Iterable[tuple[str, bool]], order: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
    """(category, right) pairs -> {category: (right, total)}, in `order` first, then as they came."""
    tally: dict[str, list[int]] = {c: [0, 0] for c in order}
    for category, right in verdicts:
        t = tally.setdefault(category, [0, 0])
        t[0] += int(right)
        t[1] += 1
    return {c: (r, n) for c, (r, n) in tally.items() if n}


def categories(items: Sequence[Question]) -> list[str]:
    """The categories in the order the file first names them."""
    return list(dict.fromkeys(q.category for q in items))


def percent(counts: Mapping[str, tuple[int, int]]) -> float:
    right, total = sum(r for r, _ in counts.values()), sum(n for _, n in counts.values())
    return 100.0 * right / total if total else 0.0
