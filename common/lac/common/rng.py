"""Randomness for privacy mechanisms.

Production code draws every random bit from a cryptographically secure generator: the
ChaCha20 keystream (the construction behind Linux's ``getrandom`` and OpenBSD's
``arc4random``) under a fresh 256-bit key from ``os.urandom``, rekeyed from the OS every
``REKEY_BYTES``. ``CsprngGenerator`` turns those bits into the few distributions the
mechanisms need, vectorised with numpy, with the same call signatures as
``numpy.random.Generator``: both satisfy ``RandomSource``, the protocol every mechanism takes,
so that tests can inject a seeded numpy generator instead.
A numpy PCG64 stream seeded from the OS would not do: its state can be recovered from
its outputs, so only its seed would be cryptographic.

Fork safety: a forked child inherits its parent's memory, keystream position included, so a
generator built before ``os.fork()`` (gunicorn --preload, multiprocessing's fork start method)
would produce the same noise in both processes. Every live generator is therefore re-keyed
from ``os.urandom`` in the child right after a fork (``os.register_at_fork``).

Thread safety: one generator may be shared by threads (an app's Localizer serving several requests at once):
each draw takes its own stretch of the keystream under the generator's lock, so no two draws share bytes and
the stream, which the cipher refuses to run concurrently, is never entered twice.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from typing import Any, Protocol, TypeAlias, overload, runtime_checkable

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

REKEY_BYTES = 1 << 30
_EPS52 = 2.0**-52

Size: TypeAlias = int | tuple[int, ...]
FloatArray: TypeAlias = npt.NDArray[np.float64]


@runtime_checkable
class RandomSource(Protocol):
    """The draws LAC's mechanisms and releases take: ``CsprngGenerator`` in production, a seeded
    ``numpy.random.Generator`` in tests and reproducible audits (numpy's signatures; ``size=None``
    gives a float)."""

    @overload
    def random(self, size: None = None) -> float: ...
    @overload
    def random(self, size: Size) -> FloatArray: ...

    @overload
    def standard_normal(self, size: None = None) -> float: ...
    @overload
    def standard_normal(self, size: Size) -> FloatArray: ...

    @overload
    def gamma(self, shape: float, scale: float = 1.0, size: None = None) -> float: ...
    @overload
    def gamma(self, shape: float, scale: float, size: Size) -> FloatArray: ...

    @overload
    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: None = None) -> float: ...
    @overload
    def laplace(self, loc: float, scale: float, size: Size) -> FloatArray: ...

    def permutation(self, x: int, /) -> npt.NDArray[np.int64]: ...

    def choice(self, a: npt.ArrayLike, size: int, replace: bool = True) -> npt.NDArray[Any]: ...


_LIVE: weakref.WeakSet[CsprngGenerator] = weakref.WeakSet()  # generators to re-key in a forked child


def _rekey_after_fork() -> None:
    for g in list(_LIVE):
        g._lock = threading.Lock()  # another thread of the parent may have held it: that thread is not here
        g._rekey()


os.register_at_fork(after_in_child=_rekey_after_fork)


def _count(size: Size | None) -> int:
    return int(np.prod(size)) if size is not None else 1


def _shaped(values: FloatArray, size: Size | None) -> FloatArray | float:
    """numpy's convention: an array of shape ``size``, or a float when ``size`` is None."""
    return values.reshape(size) if size is not None else float(values[0])


class CsprngGenerator:
    """Uniform, normal, gamma (integer shape), Laplace variates and permutations from ChaCha20.

    Uniform doubles take 52 random bits and lie strictly inside (0, 1); normals use
    Marsaglia's polar method; Gamma(a, θ), a ≥ 1, by Marsaglia–Tsang rejection (exact);
    Laplace uses the inverse CDF; permutations sort 64-bit random keys, redrawing on ties
    (exactly uniform).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one draw at a time: the keystream is not for concurrent use
        self._rekey()
        _LIVE.add(self)

    def _rekey(self) -> None:
        cipher = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None)
        self._stream = cipher.encryptor()
        self._left = REKEY_BYTES

    def _fill(self, n: int) -> npt.NDArray[np.uint64]:
        """n fresh random uint64 in a new writable array (any thread: each call takes its own keystream bytes)."""
        zeros = np.zeros(8 * n, dtype=np.uint8)
        out = np.empty(8 * n + 64, dtype=np.uint8)  # update_into may want a block of headroom
        with self._lock:
            if 8 * n > self._left:
                self._rekey()
            self._left -= 8 * n
            self._stream.update_into(zeros.data, out.data)
        return out[: 8 * n].view(np.uint64)

    def _unit(self, n: int, offset: float) -> FloatArray:
        """n doubles (k + offset)·2^-52, k uniform on 0..2^52-1, built in place from 52 random bits."""
        x = self._fill(n)
        x >>= np.uint64(12)
        x |= np.uint64(0x3FF0000000000000)  # exponent of 1.0: the bits become a double in [1, 2)
        f = x.view(np.float64)
        f -= 1.0 - offset * _EPS52
        return f

    def _open_uniform(self, n: int) -> FloatArray:
        """Uniform on (0, 1), never 0 or 1: the midpoints (k + 1/2)·2^-52."""
        return self._unit(n, 0.5)

    @overload
    def random(self, size: None = None) -> float: ...
    @overload
    def random(self, size: Size) -> FloatArray: ...

    def random(self, size: Size | None = None) -> FloatArray | float:
        """Uniform on [0, 1) (like ``Generator.random``), on the 2^-52 grid."""
        n = _count(size)
        u = self._unit(n, 0.0)
        return _shaped(u, size)

    @overload
    def standard_normal(self, size: None = None) -> float: ...
    @overload
    def standard_normal(self, size: Size) -> FloatArray: ...

    def standard_normal(self, size: Size | None = None) -> FloatArray | float:
        """Marsaglia's polar method: exact, and no trigonometric calls (faster than Box–Muller here)."""
        n = _count(size)
        out = np.empty(n)
        filled = 0
        while filled < n:
            pairs = (n - filled + 1) // 2
            draw = pairs + pairs // 3 + 16  # a pair is accepted with probability pi/4: usually one round
            xy = self._open_uniform(2 * draw).reshape(2, draw)
            xy *= 2.0
            xy -= 1.0  # a grid symmetric about 0 on (-1, 1) that never hits 0
            s = np.einsum("ij,ij->j", xy, xy)
            inside = s < 1.0
            xy = np.compress(inside, xy, axis=1)[:, :pairs]
            s = np.compress(inside, s)[:pairs]
            f = np.log(s)
            f *= -2.0
            f /= s
            np.sqrt(f, out=f)
            xy *= f
            z = xy.ravel()[: n - filled]  # x·f and y·f: two independent normals per pair
            out[filled : filled + z.size] = z
            filled += z.size
        return _shaped(out, size)

    @overload
    def standard_exponential(self, size: None = None) -> float: ...
    @overload
    def standard_exponential(self, size: Size) -> FloatArray: ...

    def standard_exponential(self, size: Size | None = None) -> FloatArray | float:
        """Exponential(1) by the inverse CDF of an open uniform."""
        n = _count(size)
        e = -np.log(self._open_uniform(n))
        return _shaped(e, size)

    @overload
    def gamma(self, shape: float, scale: float = 1.0, size: None = None) -> float: ...
    @overload
    def gamma(self, shape: float, scale: float, size: Size) -> FloatArray: ...

    def gamma(self, shape: float, scale: float = 1.0, size: Size | None = None) -> FloatArray | float:
        """Gamma(shape, scale) for shape >= 1 by Marsaglia–Tsang rejection (exact), vectorised."""
        if not shape >= 1:
            raise ValueError(f"CsprngGenerator.gamma supports shape >= 1 (the embedding dimension), got {shape}")
        n = _count(size)
        d = shape - 1.0 / 3.0
        c = 1.0 / math.sqrt(9.0 * d)
        out = np.empty(n)
        todo = np.arange(n)
        while todo.size:
            x = self.standard_normal(todo.size)
            v = (1.0 + c * x) ** 3
            log_u = np.log(self._open_uniform(todo.size))
            with np.errstate(invalid="ignore", divide="ignore"):
                ok = (v > 0) & (log_u < 0.5 * x * x + d - d * v + d * np.log(v))
            out[todo[ok]] = d * v[ok]
            todo = todo[~ok]
        out *= scale
        return _shaped(out, size)

    @overload
    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: None = None) -> float: ...
    @overload
    def laplace(self, loc: float, scale: float, size: Size) -> FloatArray: ...

    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: Size | None = None) -> FloatArray | float:
        """Laplace(loc, scale) by the inverse CDF."""
        n = _count(size)
        u = self._open_uniform(n) - 0.5  # (-1/2, 1/2), never 0 exactly
        x = loc - scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))
        return _shaped(x, size)

    def permutation(self, n: int, /) -> npt.NDArray[np.int64]:
        """A uniformly random permutation of ``range(n)``."""
        while True:
            keys = self._fill(n)
            order = np.argsort(keys, kind="stable")
            if n < 2 or np.all(keys[order[1:]] != keys[order[:-1]]):
                return order

    def choice(self, a: npt.ArrayLike, size: int, replace: bool = True) -> npt.NDArray[Any]:
        """``size`` items of ``a`` (or of ``range(a)`` for an int), uniformly, with or without replacement."""
        pool: npt.NDArray[Any] = np.arange(int(a)) if isinstance(a, int | np.integer) else np.asarray(a)
        if replace:
            idx = np.minimum((self.random(size) * len(pool)).astype(np.int64), len(pool) - 1)
            return pool[idx]  # 52-bit uniforms: bias below 2^-52 · len(pool)
        if size > len(pool):
            raise ValueError("cannot take a larger sample than the population without replacement")
        return pool[self.permutation(len(pool))[:size]]


def secure_generator() -> CsprngGenerator:
    """A generator whose every bit comes from a ChaCha20 keystream keyed by the OS CSPRNG."""
    return CsprngGenerator()


def generator(seed: int | None = None) -> RandomSource:
    """``secure_generator()`` unless a test or a reproducible audit supplies ``seed``."""
    return secure_generator() if seed is None else np.random.default_rng(seed)
