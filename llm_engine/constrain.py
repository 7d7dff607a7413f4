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

from llm_engine.tokenizer import Tokenizer

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


def warm(tokenizer: Tokenizer) -> None:
    """Build the tokenizer's llguidance view now (e.g. at server start) rather than on the first constrained request."""
    _ll_tokenizer(tokenizer)


class Guide:
    """One request's grammar state: mask() before each sample, accept() after it. Runs on the engine thread, except
    __init__ (on the submitting thread: compiling a large schema never holds up the other requests' steps)."""

    def __init__(self, tokenizer: Tokenizer, constraint: Constraint) -> None:
        self.tok = tokenizer
        self.trigger = constraint.trigger
        self.active = constraint.trigger is None  # masking now
        self.dead = False  # the text after the trigger broke the grammar: free text from there on
        self._seen = ""  # output text while waiting for the trigger
        self.matcher = _lib().LLMatcher(_ll_tokenizer(tokenizer), constraint.grammar)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        words = (tokenizer.vocab_size + 31) // 32
        self._bits = torch.zeros(words, dtype=torch.int32)  # [W] the mask llguidance fills, one bit a token
        self._shifts = torch.arange(32, dtype=torch.int32)

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

    def accept(self, token: int, text: str) -> None:
        """The token sampled (not a stop token) and the text it added to the reply."""
        if self.active:
            if not self.matcher.consume_token(token):
                raise GrammarError(f"token {token} broke the grammar: {self.matcher.get_error()}")
            return
        if self.dead or self.trigger is None:
            return
        self._seen += text
        at = self._seen.find(self.trigger)
        if at < 0:
            return
        self.active = True
        tail = self._seen[at + len(self.trigger) :]
        # The trigger's last token may carry text past it: the grammar takes that text's tokens (it matches bytes)
        if tail and not self.matcher.consume_tokens(self.tok.encode(tail)):
            self.active, self.dead = False, True
