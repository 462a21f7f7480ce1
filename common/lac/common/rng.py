"""Randomness for privacy mechanisms.

Production code draws from the OS CSPRNG: numpy generators are seeded with 256 bits
from ``os.urandom`` (never from time or a fixed seed). Tests pass an explicit seed.
"""

from __future__ import annotations

import os

import numpy as np


def secure_generator() -> np.random.Generator:
    """A fresh PCG64 generator seeded with 256 bits from the OS CSPRNG."""
    return np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(32), "little")))


def generator(seed: int | None = None) -> np.random.Generator:
    """``secure_generator()`` unless a test supplies ``seed``."""
    return secure_generator() if seed is None else np.random.default_rng(seed)
