"""The shortest way to finish a grammar: from a matcher's state, the tokens that reach an accepting state soonest.

A greedy walk on a copy of the llguidance matcher. At each state it takes the allowed token that most directly
closes: inside a string a closing quote (with the brackets and braces after it); else closing brackets and braces,
then a separator (a required key or item still to come), then the smallest value (`""`, `0`, `[]`, ...); else the
grammar's forced tokens; else, among a few allowed tokens (a choice of keys or enum values), the one whose own walk
is shortest. The preferences are JSON's; any other grammar still closes, through the forced and allowed tokens.
It knows tokens and the matcher, nothing about sampling, budgets or requests.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_engine.tokenizer import Tokenizer

# A choice among this many allowed tokens or fewer is settled by walking each (a key or an enum value: a few
# tokens). More than that is free text (a string with minLength, a number): the longest token progresses most.
LOOKAHEAD_TOKENS = 16

_QUOTE_CLOSERS = re.compile(rb'"[\]}]*')  # a string's closing quote, then what closes around it
_CLOSERS = re.compile(rb"[\]}]+")
_SEPARATORS = re.compile(rb',[ ]?"?')  # the next item, or the next key's opening quote
_VALUES = (b'""', b"0", b"[]", b"{}", b"true", b"null", b"false")  # the smallest of each type, shortest first
# an array opened empty (`[` then `]`) rather than with an item (`["`); an object with its first key's quote
_OPENERS = (b'"', b"[", b'{"', b"{", b'["', b"[{")


@dataclass(frozen=True)
class Quote:
    """Where JSON text stands lexically: inside a string (and just after a backslash in it) or not."""

    inside: bool = False
    escaped: bool = False

    def scan(self, data: bytes) -> Quote:
        inside, escaped = self.inside, self.escaped
        for b in data:
            if escaped:
                escaped = False
            elif inside and b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                inside = not inside
        return Quote(inside, escaped)


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """A tokenizer's tokens sorted into the walk's preferences (token ids, best first), built once per tokenizer."""

    token_bytes: tuple[bytes, ...]  # [V] each token's bytes (special tokens: b"")
    lengths: np.ndarray  # [V] int64, bytes per token
    quote_closers: np.ndarray  # longest first: `"]}` closes a string, an array and an object in one token
    closers: np.ndarray  # longest first
    separators: np.ndarray  # longest first
    values: np.ndarray  # in _VALUES' order, each with or without a leading space
    openers: np.ndarray  # in _OPENERS' order

    def text_len(self, tokens: tuple[int, ...]) -> int:
        """The bytes these tokens write."""
        return int(self.lengths[list(tokens)].sum()) if tokens else 0


@functools.lru_cache(maxsize=4)
def vocabulary(tokenizer: Tokenizer, ll_tokenizer: Any) -> Vocabulary:
    """Built once per tokenizer (~0.1 s for a 49k vocabulary), by the first closing request's Guide on its submitting
    thread, not on the engine thread."""
    n = tokenizer.vocab_size
    data = tuple(b"" if ll_tokenizer.is_special_token(i) else ll_tokenizer.decode_bytes([i]) for i in range(n))

    def pick(pattern: re.Pattern[bytes]) -> np.ndarray:
        ids = [i for i, b in enumerate(data) if pattern.fullmatch(b)]
        return np.array(sorted(ids, key=lambda i: (-len(data[i]), i)), dtype=np.int64)

    def ranked(texts: tuple[bytes, ...]) -> np.ndarray:  # in the order of `texts`, each with or without a space
        rank = {v: k for k, v in enumerate(texts)}
        ids = [i for i, b in enumerate(data) if b.removeprefix(b" ") in rank]
        return np.array(sorted(ids, key=lambda i: (rank[data[i].removeprefix(b" ")], len(data[i]), i)), dtype=np.int64)

    return Vocabulary(
        token_bytes=data, lengths=np.array([len(b) for b in data], dtype=np.int64),
        quote_closers=pick(_QUOTE_CLOSERS), closers=pick(_CLOSERS), separators=pick(_SEPARATORS),
        values=ranked(_VALUES), openers=ranked(_OPENERS),
    )  # fmt: skip


@dataclass(frozen=True)
class Closing:
    tokens: tuple[int, ...]  # the walk's tokens, in order
    complete: bool  # they reach a state where the grammar accepts; False: not within the limit (or not at all)


def closing_path(matcher: Any, vocab: Vocabulary, quote: Quote, limit: int, lookahead: bool = True) -> Closing:
    """The tokens (at most `limit`) that bring the matcher from its state to an accepting one; the matcher itself
    is left as it was (the walk runs on a copy). `quote`: where the text consumed so far stands."""
    m = matcher.deep_copy()
    path: list[int] = []
    while not m.is_accepting():
        if len(path) >= limit or m.is_error() or m.is_stopped():
            return Closing(tuple(path), False)
        bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint32)  # [W] one bit a token
        chosen = _preferred(bits, vocab, quote)
        step = [chosen] if chosen is not None else m.compute_ff_tokens()[: limit - len(path)]
        if not step:
            choice = _choose(m, bits, vocab, quote, limit - len(path), lookahead)
            if choice is None:
                return Closing(tuple(path), False)
            step = [choice]
        for token in step:
            if not m.consume_token(token):
                return Closing(tuple(path), False)
            path.append(token)
            quote = quote.scan(vocab.token_bytes[token])
    return Closing(tuple(path), True)


def _allowed(bits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = ids[(ids >> 5) < bits.size]
    return ids[((bits[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]


def _preferred(bits: np.ndarray, vocab: Vocabulary, quote: Quote) -> int | None:
    # Inside a string only a quote closes (a bracket or a `0` there would be text); outside one, a quote opens a
    # string, so the groups that close or finish a value come first and never hold a quote at their start.
    groups = (vocab.quote_closers,) if quote.inside else (vocab.closers, vocab.separators, vocab.values, vocab.openers)
    for group in groups:
        ok = _allowed(bits, group)
        if ok.size:
            return int(ok[0])
    return None


def _choose(m: Any, bits: np.ndarray, vocab: Vocabulary, quote: Quote, limit: int, lookahead: bool) -> int | None:
    """No preferred token is allowed and none is forced: a choice between keys or enum values, or free text."""
    allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))  # [K] token ids
    allowed = allowed[allowed < len(vocab.token_bytes)]
    allowed = allowed[vocab.lengths[allowed] > 0]  # not a special token (the end of the reply is not a step)
    if allowed.size == 0:  # nothing but the end, yet not accepting: no way to close (not seen from a JSON schema)
        return None
    if lookahead and allowed.size <= LOOKAHEAD_TOKENS:
        best: tuple[int, int] | None = None  # (tokens to close after it, token)
        for token in map(int, allowed):
            after = m.deep_copy()
            if not after.consume_token(token):
                continue
            cap = limit - 1 if best is None else best[0] - 1  # only a shorter way counts: stop walking past it
            rest = closing_path(after, vocab, quote.scan(vocab.token_bytes[token]), cap, lookahead=False)
            if rest.complete and (best is None or len(rest.tokens) < best[0]):
                best = (len(rest.tokens), token)
        if best is not None:
            return best[1]
    return int(allowed[np.argmax(vocab.lengths[allowed])])
