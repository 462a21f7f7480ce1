"""Uniform random permutation driven by the OS CSPRNG."""

from __future__ import annotations

import secrets
from typing import MutableSequence

_SYSTEM_RANDOM = secrets.SystemRandom()


def secure_shuffle(items: MutableSequence) -> None:
    """Shuffle ``items`` in place: Fisher–Yates with indices drawn from ``os.urandom``.

    ``random.SystemRandom.shuffle`` is Fisher–Yates with unbiased ``_randbelow`` draws,
    so every permutation is equally likely (up to the CSPRNG).
    """
    _SYSTEM_RANDOM.shuffle(items)
