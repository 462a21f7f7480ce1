"""lac.common.retry: exponential back-off with full jitter, a server's retry-after as a floor, and the two
runners (sync and async) on real failing functions."""

from __future__ import annotations

import asyncio
import random

import pytest

from lac.common.retry import DEFAULT, Backoff, call, call_async, jittered


def test_ceilings_grow_and_stop_at_the_maximum():
    b = Backoff(0.5, 5.0)
    assert [b.ceiling(k) for k in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.ceiling(10_000) == 5.0  # no overflow
    assert [b.grow(c) for c in (0.5, 4.0, 5.0)] == [1.0, 5.0, 5.0]
    assert (DEFAULT.initial, DEFAULT.maximum, DEFAULT.factor) == (0.2, 30.0, 2.0)
    for bad in ((0.0, 1.0), (2.0, 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError):
            Backoff(*bad)
    with pytest.raises(ValueError, match="factor"):
        Backoff(1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="attempt"):
        b.ceiling(0)


def test_full_jitter_is_uniform_below_the_ceiling():
    rng = random.Random(7)
    b = Backoff(1.0, 8.0)
    draws = [b.delay(3, uniform=rng.random) for _ in range(20_000)]  # ceiling 4
    assert 0 <= min(draws) < 0.01 and 3.99 < max(draws) < 4.0
    mean = sum(draws) / len(draws)
    assert abs(mean - 2.0) < 4 * (4 / 12**0.5) / len(draws) ** 0.5  # Uniform(0, 4): sd 4/sqrt(12)
    assert jittered(3.0, lambda: 0.5) == 1.5 and jittered(-1.0, lambda: 0.5) == 0.0


def test_retry_after_is_a_floor_capped_at_the_maximum():
    b = Backoff(0.2, 30.0)
    assert b.delay(1, at_least=7.0, uniform=lambda: 0.0) == 7.0
    assert b.delay(1, at_least=100.0, uniform=lambda: 0.0) == 30.0
    assert b.delay(1, at_least=None, uniform=lambda: 0.5) == 0.1
    assert b.delay(3, at_least=0.1, uniform=lambda: 0.5) == 0.4  # the jittered wait, when longer


class Flaky:
    """Fails ``failures`` times with ``exc``, then returns "ok"."""

    def __init__(self, failures: int, exc: Exception):
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def test_call_retries_what_is_retryable_and_waits_the_policy():
    waits: list[float] = []
    f = Flaky(3, ConnectionError("down"))
    out = call(
        f,
        attempts=5,
        retryable=lambda e: isinstance(e, ConnectionError),
        backoff=Backoff(1.0, 3.0),
        sleep=waits.append,
        uniform=lambda: 0.5,
    )
    assert (out, f.calls, waits) == ("ok", 4, [0.5, 1.0, 1.5])


def test_call_gives_up_with_the_last_failure_and_never_retries_others():
    waits: list[float] = []
    f = Flaky(10, ConnectionError("still down"))
    with pytest.raises(ConnectionError, match="still down"):
        call(f, attempts=3, retryable=lambda e: True, sleep=waits.append)
    assert f.calls == 3 and len(waits) == 2
    g = Flaky(10, ValueError("bad request"))
    with pytest.raises(ValueError, match="bad request"):
        call(g, attempts=3, retryable=lambda e: isinstance(e, ConnectionError), sleep=waits.append)
    assert g.calls == 1
    with pytest.raises(ValueError, match="attempts"):
        call(g, attempts=0, retryable=lambda e: True)


def test_call_honours_the_servers_retry_after():
    waits: list[float] = []

    class Busy(Exception):
        retry_after = 2.5

    call(
        Flaky(1, Busy()),
        attempts=2,
        retryable=lambda e: True,
        retry_after=lambda e: getattr(e, "retry_after", None),
        sleep=waits.append,
        uniform=lambda: 0.0,
    )
    assert waits == [2.5]


def test_call_async_retries_on_the_event_loop():
    f = Flaky(2, TimeoutError())

    async def fn() -> str:
        return f()

    out = asyncio.run(
        call_async(fn, attempts=3, retryable=lambda e: isinstance(e, TimeoutError), backoff=Backoff(0.01, 0.02))
    )
    assert (out, f.calls) == ("ok", 3)
    g = Flaky(5, TimeoutError("late"))

    async def gn() -> str:
        return g()

    with pytest.raises(TimeoutError, match="late"):
        asyncio.run(call_async(gn, attempts=2, retryable=lambda e: True, backoff=Backoff(0.01, 0.01)))
    assert g.calls == 2
