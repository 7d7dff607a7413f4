"""Speculative decoding for a request that runs alone, with each slot's draft cache kept caught up with its target cache.

It knows Generation, a slot's cached tokens and SpeculativeDecoder; nothing about scheduling, threads or
other requests (the engine decides when a request runs alone).
"""
from __future__ import annotations

import time

from llm_engine.generation import Generation
from llm_engine.kv_cache import SlotState, StaticKVCache, common_prefix_len
from llm_engine.request import Event
from llm_engine.speculative import SpeculativeDecoder


class SoloSpeculation:
    """Why the bookkeeping: a slot's draft cache falls behind whenever the slot decodes without the draft (in a
    batch) or takes a new prompt; before the next speculative step the draft is fed only what it lacks.
    """

    def __init__(self, decoder: SpeculativeDecoder) -> None:
        self.decoder = decoder
        self._held: dict[int, list[int]] = {}  # slot -> tokens whose keys/values its draft cache surely holds
        self._live: set[int] = set()  # last step speculative: the decoder itself tracks the token its draft lacks

    def pause(self, slot: int) -> None:
        """The slot moves on without the draft (a prompt chunk, a batched step): catch up before speculating again."""
        self._live.discard(slot)

    def forget(self, slot: int) -> None:
        """The draft cache may be half-written: trust none of it."""
        self._held.pop(slot, None)
        self._live.discard(slot)
        self.decoder.forget(slot)

    def step(self, gen: Generation, slot: int, state: SlotState, cache: StaticKVCache) -> list[Event]:
        """One draft-then-verify step for this request: 1 .. k+1 tokens, each through Generation's usual checks."""
        token, pos = gen.decode_input(state)
        t0 = time.perf_counter()
        try:
            if slot not in self._live:
                held = common_prefix_len(self._held.get(slot, []), state.tokens)
                self.decoder.prefill_draft(slot, state.tokens[held:], held)
                self._held[slot] = list(state.tokens)
                self._live.add(slot)
            drafted_before = self.decoder.stats.drafted
            out = self.decoder.step(slot, token, pos, gen.params, gen.generator, gen.history())
        except Exception:
            self.forget(slot)
            raise
        events = gen.take_tokens(out, cache, state, 1000 * (time.perf_counter() - t0))
        # The draft holds every fed token but possibly the last (accepted drafts it has not run yet); with no
        # room left to draft it fell behind further, so nothing is assumed.
        self._held[slot] = list(state.tokens[:-1]) if self.decoder.stats.drafted > drafted_before else []
        return events
