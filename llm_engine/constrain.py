"""Constrained decoding: a request's grammar (llguidance) as a token mask applied before each sample.

A Constraint is what a request asks for (a grammar, optionally waiting for a trigger string in the output);
a Guide is one request's live matcher on the engine thread. It knows the tokenizer and logits, nothing about
slots, batching or the wire. Why llguidance over xgrammar: docs/tools.md ("Choosing the grammar library").
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import torch

from llm_engine.closing import Closing, Quote, closing_path, vocabulary
from llm_engine.tokenizer import Tokenizer

# How near the limit (in tokens) a closing request starts measuring the way to close each step: the walk costs about
# a millisecond, so it runs only here (docs/tools.md). Where no way to close fits in what is left, nothing is steered.
CLOSE_WINDOW_TOKENS = 64
# Near the limit, a token that opens something (a new item, key or object) needs this many tokens to spare beyond
# what closing takes: room for some content, so that the limit does not close it empty.
ROOM_TO_OPEN_TOKENS = 4
# Compact, fixed JSON layout: the same text any client re-serialises, and no room for a random model to ramble
# in white space (a flexible-white-space grammar lets it emit newlines until max_tokens).
JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class GrammarError(ValueError):
    """A schema or grammar the library cannot compile; the message says why."""


@dataclass(frozen=True)
class Constraint:
    grammar: str  # an llguidance grammar (see json_schema_grammar, llm_engine.tools.call_constraint)
    # None: the grammar holds from the first token. Otherwise the output is free until this text appears in it;
    # from there on the grammar holds for what follows the trigger (a tool call's marker under tool_choice auto)
    trigger: str | None = None
    # With a trigger: a reply that begins (after white space) with this text is also taken by the grammar, from that
    # text on (a tool call written without its marker, as Qwen2.5's small models write them under tool_choice auto)
    bare_start: str | None = None
    # Near the reply's token limit, steer it to where the grammar is complete (Guide.forced, Guide.vet): the reply
    # then parses even when cut. Off for tool calls: a call cut short is dropped rather than run on a guess.
    close_at_limit: bool = False
    # Literal texts of the grammar (written as lark strings) that a tokenizer may hold as one added token, as Qwen2.5's
    # <tool_call>: the grammar library reads such a token as a token, not as its text, so where the tokenizer has it
    # the literal becomes that token (Guide.__init__; bound_markers)
    markers: tuple[str, ...] = ()


def json_schema_grammar(schema: dict[str, Any] | bool) -> str:
    """A JSON schema (or True / {} for any JSON object) -> an llguidance grammar. Raises GrammarError."""
    if schema is True or schema == {}:
        schema = {"type": "object"}
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"the schema is not JSON: {exc}") from None
    return check_grammar(_lib().LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT))


def check_grammar(grammar: str) -> str:
    """-> the grammar, or GrammarError with the library's reason (unsupported keyword, bad lark, ...)."""
    try:
        error = _lib().LLMatcher.validate_grammar(grammar)
    except Exception as exc:  # noqa: BLE001 - the library reports some errors by raising
        raise GrammarError(str(exc)) from None
    if error:
        raise GrammarError(error)
    return grammar


def _lib() -> Any:
    import llguidance  # imported on first use: ~30 ms, and most servers never constrain anything

    return llguidance


@functools.lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The tokenizer as llguidance sees it: built once per tokenizer (~1 s for a 49k vocabulary on this CPU)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=tokenizer.vocab_size, eos_token=sorted(tokenizer.stop_ids))


def bound_markers(constraint: Constraint, tokenizer: Tokenizer) -> str:
    """The constraint's grammar with each marker literal the tokenizer holds as one added token written as that token
    (`<[id]>`): the model writes the marker as its token, and the grammar must take it."""
    grammar = constraint.grammar
    added = tokenizer.hf.added_tokens_decoder
    for marker in constraint.markers:
        ids = tokenizer.encode(marker)
        if len(ids) == 1 and ids[0] in added:
            grammar = grammar.replace(json.dumps(marker), f"<[{ids[0]}]>")
    return grammar


def warm(tokenizer: Tokenizer) -> None:
    """Build the tokenizer's llguidance view now (e.g. at server start) rather than on the first constrained request."""
    _ll_tokenizer(tokenizer)


class Guide:
    """One request's grammar state: mask() before each sample, accept() after it. Runs on the engine thread, except
    __init__ (on the submitting thread: compiling a large schema never holds up the other requests' steps)."""

    def __init__(self, tokenizer: Tokenizer, constraint: Constraint) -> None:
        self.tok = tokenizer
        self.trigger = constraint.trigger
        self.bare_start = constraint.bare_start  # None once the reply's start has ruled it out
        self.active = constraint.trigger is None  # masking now
        self.dead = False  # the text after the trigger broke the grammar: free text from there on
        self._seen = ""  # output text while waiting for the trigger
        self.matcher = _lib().LLMatcher(_ll_tokenizer(tokenizer), bound_markers(constraint, tokenizer))
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        words = (tokenizer.vocab_size + 31) // 32
        self._bits = torch.zeros(words, dtype=torch.int32)  # [W] the mask llguidance fills, one bit a token
        self._shifts = torch.arange(32, dtype=torch.int32)
        self.close_at_limit = constraint.close_at_limit
        # built here, on the submitting thread (~0.1 s once per tokenizer), not on the engine thread's step
        self._vocab = vocabulary(tokenizer, _ll_tokenizer(tokenizer)) if constraint.close_at_limit else None
        self._quote = Quote()  # where the text the grammar has taken stands (inside a string or not)
        self._path: Closing | None = None  # the way to close from the matcher's state (None: not measured yet)
        self._next: tuple[int, Closing] | None = None  # the token chosen this step, and the way to close after it
        self.steered = 0  # tokens the limit chose instead of the model (forced or put in place of its pick)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more: the reply ends here."""
        return self.active and self.matcher.is_stopped()

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] -> logits [V] with every token the grammar forbids at this point set to -inf."""
        if not self.active:
            return logits
        self.matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
        allowed = ((self._bits[:, None] >> self._shifts) & 1).view(-1).bool()  # [32 W]
        v = logits.shape[-1]
        if allowed.numel() < v:  # a model head wider than the tokenizer: the extra rows are never valid
            allowed = torch.cat([allowed, allowed.new_zeros(v - allowed.numel())])
        return logits.masked_fill(~allowed[:v].to(logits.device), float("-inf"))

    def forced(self, left: int) -> int | None:
        """left: the tokens the reply may still add, this one included. -> the token to take without sampling once
        closing needs all the tokens left (the next one on the way to close); None: sample under mask() and vet()."""
        if not self._closing(left):
            return None
        path = self._closing_path(left)
        if path.complete and path.tokens and len(path.tokens) >= left:
            return self._steer(path)
        return None  # room to spare, or no way to close in what is left (then the reply is cut, as without closing)

    def vet(self, token: int, left: int) -> int:
        """The token sampled under mask() -> it, or in its place the next token on the way to close when after it
        the grammar could not close in the tokens then left (the model opening one more item at the limit)."""
        if not self._closing(left) or token in self.tok.stop_ids:
            return token  # a stop token passes the mask only where the grammar is complete: the reply ends whole
        assert self._vocab is not None
        path = self._closing_path(left)
        if path.tokens and token == path.tokens[0]:
            self._next = (token, Closing(path.tokens[1:], path.complete))
            return token
        after = self.matcher.deep_copy()
        after.consume_token(token)  # it passed the mask
        rest = closing_path(after, self._vocab, self._quote.scan(self._vocab.token_bytes[token]), left - 1)
        # A token that lengthens the text it takes to close opens something (an item, a key, an object): only with
        # room left to put something in it, else the limit would close it empty (["a", "b", ""]).
        opens = path.complete and self._vocab.text_len(rest.tokens) > self._vocab.text_len(path.tokens)
        room = len(rest.tokens) + (ROOM_TO_OPEN_TOKENS if opens else 0)
        if (rest.complete and room <= left - 1) or not path.complete:
            self._next = (token, rest)
            return token
        if path.tokens:
            return self._steer(path)
        self.steered += 1  # the grammar is complete here and would not be after the model's token: end the reply
        return min(self.tok.stop_ids)

    def _bare_tail(self) -> str | None:
        """The reply so far when it begins with bare_start (the grammar takes all of it), else None; rules the bare
        form out for good once the reply's start is something else."""
        if self.bare_start is None:
            return None
        start = self._seen.lstrip()
        if start.startswith(self.bare_start):
            return start
        if start and not self.bare_start.startswith(start):
            self.bare_start = None
        return None

    def _closing(self, left: int) -> bool:
        return self.close_at_limit and self.active and left <= CLOSE_WINDOW_TOKENS

    def _closing_path(self, left: int) -> Closing:
        assert self._vocab is not None
        if self._path is None:
            self._path = closing_path(self.matcher, self._vocab, self._quote, left)
        return self._path

    def _steer(self, path: Closing) -> int:
        self.steered += 1
        self._next = (path.tokens[0], Closing(path.tokens[1:], path.complete))
        return path.tokens[0]

    def accept(self, token: int, text: str) -> None:
        """The token sampled (not a stop token) and the text it added to the reply."""
        if self.active:
            if not self.matcher.consume_token(token):
                raise GrammarError(f"token {token} broke the grammar: {self.matcher.get_error()}")
            if self._vocab is not None:
                self._quote = self._quote.scan(self._vocab.token_bytes[token])
                self._path = self._next[1] if self._next is not None and self._next[0] == token else None
                self._next = None
            return
        if self.dead or self.trigger is None:
            return
        self._seen += text
        tail = self._bare_tail()
        if tail is None:
            at = self._seen.find(self.trigger)
            if at < 0:
                return
            tail = self._seen[at + len(self.trigger) :]
        self.active = True
        # The trigger's last token may carry text past it: the grammar takes that text's tokens (it matches bytes)
        if tail and not self.matcher.consume_tokens(self.tok.encode(tail)):
            self.active, self.dead = False, True
        self._quote = self._quote.scan(tail.encode())
