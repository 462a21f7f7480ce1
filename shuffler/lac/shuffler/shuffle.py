"""Privacy randomness of the amplifier, all from the OS CSPRNG (``os.urandom``).

* ``secure_permutation(n)``: a uniform permutation of ``range(n)`` obtained by sorting n
  independent uniform 64-bit keys from ``os.urandom``. Given that the keys are distinct,
  every ordering of them is equally likely, so the permutation is exactly uniform; a tie
  (probability < n²/2^65, about 3e-8 for n = 10^6) is detected and all keys are redrawn.
  This is vectorised (numpy sorts; numpy's PRNGs are never used) and gives the same
  distribution as a Fisher–Yates shuffle driven by the CSPRNG.
* ``bernoulli_mask(n, q)``: n independent Bernoulli(q) draws (Poisson sub-sampling), each a
  64-bit CSPRNG word compared with q·2^64 (bias below 2^-64).
* ``geometric(mean)``: a geometric count for the randomised batch threshold.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableSequence

import numpy as np

_TWO64 = float(2**64)


def _urandom_u64(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


def secure_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` (int64 indices) from ``os.urandom``."""
    if n < 0:
        raise ValueError("n must be non-negative")
    while True:
        keys = _urandom_u64(n)
        order = np.argsort(keys)  # ties are redrawn below, so stability is irrelevant
        ranked = keys[order]
        if n < 2 or not np.any(ranked[1:] == ranked[:-1]):
            return order


def secure_shuffle(items: MutableSequence) -> None:
    """Shuffle ``items`` in place uniformly (see ``secure_permutation``)."""
    perm = secure_permutation(len(items))
    items[:] = [items[i] for i in perm]


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
