"""Pinned prompt prefixes: the keys and values of a persona's system prompt, kept apart from the slots, so a new
conversation copies them in even when every slot that held them is busy or was given to someone else.

Bounded by count and tokens, least recently used out first. Owned by the engine thread (no locks); knows the
cache's tensor layout, not sessions or the scheduler.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from llm_engine.kv_cache import MIN_SHARED_PREFIX, StaticKVCache, common_prefix_len


class PrefixPins:
    def __init__(self, max_pins: int = 8, max_tokens: int = 8192) -> None:
        self.max_pins = max_pins
        self.max_tokens = max_tokens
        # token ids -> the cache's keys and values (and an int8 cache's scales) of those positions, as stored
        self._pins: OrderedDict[tuple[int, ...], list[torch.Tensor]] = OrderedDict()
        self.hits = 0  # requests that copied a pinned prefix
        self.tokens = 0  # tokens those copies saved computing

    def __len__(self) -> int:
        return len(self._pins)

    def pin(self, cache: StaticKVCache, slot: int, tokens: Sequence[int]) -> None:
        """Keep positions [0, len(tokens)) of `slot` (which holds `tokens` there) under those token ids."""
        key = tuple(tokens)
        if len(key) < MIN_SHARED_PREFIX or len(key) > self.max_tokens:
            return
        if key in self._pins:
            self._pins.move_to_end(key)
            return
        n = len(key)
        self._pins[key] = cache.save_prefix(slot, n)
        while len(self._pins) > self.max_pins or sum(len(k) for k in self._pins) > self.max_tokens:
            self._pins.popitem(last=False)

    def best(self, prompt: Sequence[int], at_least: int = MIN_SHARED_PREFIX) -> tuple[tuple[int, ...], int] | None:
        """-> (pin, n): the pin sharing the longest prefix with `prompt`, n >= at_least tokens of it; else None."""
        found, found_len = None, at_least - 1
        for key in self._pins:
            n = common_prefix_len(key, prompt)
            if n > found_len:
                found, found_len = key, n
        return None if found is None else (found, found_len)

    def copy_into(self, cache: StaticKVCache, pin: tuple[int, ...], dst: int, n: int) -> None:
        """The pin's first n positions into slot `dst`, every layer."""
        cache.load_prefix(self._pins[pin], dst, n)
        self._pins.move_to_end(pin)
        self.hits += 1
        self.tokens += n
