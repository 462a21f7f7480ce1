"""Privacy randomness of the amplifier besides the shuffle itself, all from the OS CSPRNG (``os.urandom``).

The uniform permutation is ``lac.common.rng.secure_generator().permutation(n)`` (sorted 64-bit ChaCha20 keys
keyed from the OS, ties redrawn: exactly uniform, the distribution of a CSPRNG-driven Fisher–Yates shuffle).

* ``bernoulli_mask(n, q)``: n independent Bernoulli(q) draws (Poisson sub-sampling), each a
  64-bit CSPRNG word compared with q·2^64 (bias below 2^-64).
* ``geometric(mean)``: a geometric count for the randomised batch threshold.
"""

from __future__ import annotations

import math
import os

import numpy as np

_TWO64 = float(2**64)


def _urandom_u64(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


def bernoulli_mask(n: int, q: float) -> np.ndarray:
    """n independent Bernoulli(q) booleans from the OS CSPRNG."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be in [0, 1]")
    if q >= 1.0:
        return np.ones(n, dtype=bool)
    # q * 2^64 as an exact integer threshold: keep iff word < threshold.
    threshold = np.uint64(min(int(q * _TWO64), 2**64 - 1))
    return _urandom_u64(n) < threshold


def geometric(mean: float) -> int:
    """A count k >= 0 with Pr[k] = (1-p) p^k and E[k] = mean (0 when mean <= 0), from the CSPRNG."""
    if mean <= 0:
        return 0
    p = mean / (1.0 + mean)
    u = (int.from_bytes(os.urandom(8), "big") + 1) / (_TWO64 + 1)  # uniform in (0, 1)
    return math.floor(math.log(u) / math.log(p))
