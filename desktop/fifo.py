"""A queue of float32 samples fed in chunks and read in blocks of any size (zeros when short).

Thread-safe, bounded if asked (oldest samples go first). Knows nothing about what the samples are.
"""
from __future__ import annotations

import collections
import threading

import numpy as np


class SampleFifo:
    def __init__(self, max_samples: int | None = None) -> None:
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self._n = 0
        self._max = max_samples
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def push(self, samples: np.ndarray) -> None:
        with self._lock:
            self._chunks.append(np.asarray(samples, np.float32))
            self._n += len(samples)
            while self._max is not None and self._chunks and self._n - len(self._chunks[0]) >= self._max:
                self._n -= len(self._chunks.popleft())

    def take(self, n: int) -> np.ndarray:
        """The next n samples; the part the queue cannot supply is zeros."""
        out = np.zeros(n, np.float32)
        pos = 0
        with self._lock:
            while pos < n and self._chunks:
                head = self._chunks[0]
                k = min(n - pos, len(head))
                out[pos:pos + k] = head[:k]
                pos += k
                self._n -= k
                if k == len(head):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = head[k:]
        return out
