"""Test audio that needs no model: speech-like noise any energy detector hears as voiced."""
from __future__ import annotations

import numpy as np


def speechlike(seconds: float, rate: int = 16000, level: float = 0.15, seed: int = 1) -> np.ndarray:
    """Syllable-rate modulated noise: voiced enough for any energy detector, no model needed."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * np.arange(n) / rate)
    return (rng.standard_normal(n) * level * envelope).astype(np.float32)
