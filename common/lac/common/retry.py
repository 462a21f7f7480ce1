"""One retry policy for every LAC caller: exponential back-off with full jitter.

Attempt k (1, 2, ...) may wait up to ``min(maximum, initial · factor^(k-1))``; the wait itself is drawn
uniformly below that ceiling ("full jitter"), so many callers that failed together do not come back
together. A server's own hint (a ``retry-after``) is a floor, never exceeded past ``maximum``.
``call`` and ``call_async`` run a function with that policy; ``Backoff`` alone serves loops that keep
their own state (e.g. ``lac.common.storage``'s test writes).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "DEFAULT", "call", "call_async", "jittered"]

T = TypeVar("T")
Uniform = Callable[[], float]  # a draw uniform on [0, 1), e.g. random.random (jitter is not privacy randomness)


def jittered(ceiling: float, uniform: Uniform = random.random) -> float:
    """A wait drawn uniformly from [0, ``ceiling``) (full jitter)."""
    return max(ceiling, 0.0) * uniform()


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off: ceilings ``initial``, ``initial·factor``, ... up to ``maximum`` seconds."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and 0 < self.initial <= self.maximum and math.isfinite(self.maximum)):
            raise ValueError(f"need 0 < initial <= maximum, finite; got {self.initial!r}, {self.maximum!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be finite and >= 1, got {self.factor!r}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (1 for the first)."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt!r}")
        if (attempt - 1) * math.log(self.factor) >= math.log(self.maximum / self.initial):
            return self.maximum  # (and no float overflow for a large attempt)
        return min(self.maximum, self.initial * self.factor ** (attempt - 1))

    def grow(self, ceiling: float) -> float:
        """The ceiling that follows ``ceiling``."""
        return min(self.maximum, ceiling * self.factor)

    def delay(self, attempt: int, at_least: float | None = None, uniform: Uniform = random.random) -> float:
        """The wait after failed attempt ``attempt``: full jitter below its ceiling, but at least ``at_least``
        (a server's retry-after), itself capped at ``maximum``."""
        floor = min(max(at_least or 0.0, 0.0), self.maximum)
        return max(jittered(self.ceiling(attempt), uniform), floor)


DEFAULT = Backoff()
"""0.2 s doubling up to 30 s."""


def call(
    fn: Callable[[], T],
    *,
    attempts: int,
    retryable: Callable[[BaseException], bool],
    backoff: Backoff = DEFAULT,
    retry_after: Callable[[BaseException], float | None] = lambda exc: None,
    sleep: Callable[[float], object] = time.sleep,
    uniform: Uniform = random.random,
) -> T:
    """``fn()``, retried up to ``attempts`` times in all while it raises an exception that ``retryable``
    accepts; the last failure, or any other, propagates unchanged."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not retryable(exc):
                raise
            sleep(backoff.delay(attempt, retry_after(exc), uniform))
    raise AssertionError("unreachable")


async def call_async(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    retryable: Callable[[BaseException], bool],
    backoff: Backoff = DEFAULT,
    retry_after: Callable[[BaseException], float | None] = lambda exc: None,
    uniform: Uniform = random.random,
) -> T:
    """``await fn()`` with the policy of ``call`` (the waits are ``asyncio.sleep``)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    for attempt in range(1, attempts + 1):
        try:
            return await fn()
        except Exception as exc:
            if attempt == attempts or not retryable(exc):
                raise
            await asyncio.sleep(backoff.delay(attempt, retry_after(exc), uniform))
    raise AssertionError("unreachable")
