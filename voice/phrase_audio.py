"""Synthesised audio of fixed phrases, kept and reused: a persona's greeting is the same words in the same voice for
every new session, so it is synthesised once per (text, voice, rate, output rate) and replayed after that.

A bounded LRU shared by every session (voice.stages.Stages). A changed greeting, voice or rate is another key, so
the next session synthesises it afresh and the old entry ages out. Knows nothing of sessions or the wire.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

PhraseKey = tuple[str, Hashable, str | None, float, int]  # (text, tts backend, speaker, rate, output sample rate)


class PhraseAudioCache:
    def __init__(self, max_entries: int = 64, max_seconds: float = 600.0) -> None:
        self.max_entries = max_entries
        self.max_seconds = max_seconds  # all entries' audio together, at their own rates
        self._entries: OrderedDict[PhraseKey, tuple[np.ndarray, ...]] = OrderedDict()
        self._seconds: dict[PhraseKey, float] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.stored = 0  # whole syntheses handed in (once per key, unless sessions made the same one at once)

    @staticmethod
    def key(text: str, tts: object, speaker: str | None, rate: float, sample_rate: int) -> PhraseKey:
        return (text, id(tts), speaker, float(rate), int(sample_rate))

    def get(self, key: PhraseKey) -> tuple[np.ndarray, ...] | None:
        """The phrase's audio chunks (float32 at the output rate; shared, read-only), or None."""
        with self._lock:
            chunks = self._entries.get(key)
            if chunks is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return chunks

    def put(self, key: PhraseKey, chunks: list[np.ndarray]) -> None:
        """A whole phrase's audio (only a synthesis that ran to its end is kept)."""
        frozen = tuple(np.array(c, dtype=np.float32, copy=True) for c in chunks)
        for c in frozen:
            c.flags.writeable = False
        seconds = sum(len(c) for c in frozen) / key[4]
        if seconds > self.max_seconds:
            self.stored += 1
            return
        with self._lock:
            self.stored += 1
            if key in self._entries:
                return  # two sessions synthesised it at once: the first copy stays
            self._entries[key] = frozen
            self._seconds[key] = seconds
            while len(self._entries) > self.max_entries or sum(self._seconds.values()) > self.max_seconds:
                old, _ = self._entries.popitem(last=False)
                del self._seconds[old]

    def __len__(self) -> int:
        return len(self._entries)
