"""The production generator: every distribution the mechanisms use, checked against its law.

Each KS / chi-square check has false-alarm rate 1e-4 (the tests are independent; over the
file the chance of a spurious failure is below 1e-3)."""

import numpy as np
import pytest
from scipy import stats

from lac.common import rng as rngmod
from lac.common.rng import CsprngGenerator, generator, secure_generator

ALPHA = 1e-4
N = 200_000


@pytest.fixture()
def g():
    return secure_generator()


def test_default_is_csprng_and_seed_is_for_tests_only():
    assert isinstance(generator(), CsprngGenerator)
    assert isinstance(generator(3), np.random.Generator)
    a, b = CsprngGenerator(), CsprngGenerator()
    assert not np.array_equal(a.random(8), b.random(8)), "fresh OS key per generator"


@pytest.mark.parametrize(
    "name, draw, cdf",
    [
        ("uniform", lambda g: g.random(N), stats.uniform.cdf),
        ("normal", lambda g: g.standard_normal(N), stats.norm.cdf),
        ("exponential", lambda g: g.standard_exponential(N), stats.expon.cdf),
        ("gamma d=50", lambda g: g.gamma(50, 1 / 7.5, N), stats.gamma(50, scale=1 / 7.5).cdf),
        ("gamma d=1", lambda g: g.gamma(1, 2.0, N), stats.gamma(1, scale=2.0).cdf),
        ("gamma d=300", lambda g: g.gamma(300, 0.1, N), stats.gamma(300, scale=0.1).cdf),
        ("gamma a=2.5", lambda g: g.gamma(2.5, 1.0, N), stats.gamma(2.5).cdf),
        ("laplace", lambda g: g.laplace(1.5, 0.3, N), stats.laplace(1.5, 0.3).cdf),
    ],
)
def test_distributions(g, name, draw, cdf):
    x = draw(g)
    assert x.shape == (N,) and np.isfinite(x).all()
    assert stats.kstest(x, cdf).pvalue > ALPHA, name


def test_shapes_scalars_and_normal_pairs_independent(g):
    assert g.standard_normal((3, 4)).shape == (3, 4) and isinstance(g.random(), float)
    z = g.standard_normal(N)
    x, y = z[: N // 2], z[N // 2 :]  # the polar method's x·f and y·f halves share a radius factor
    assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(N / 2)
    assert abs(np.corrcoef(x**2, y**2)[0, 1]) < 5 / np.sqrt(N / 2)  # zero for independent normals
    with pytest.raises(ValueError, match="shape >= 1"):
        g.gamma(0.5, 1.0, 10)


def test_permutations_uniform(g):
    counts = {}
    for _ in range(24_000):
        p = tuple(g.permutation(4))
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 24
    assert stats.chisquare(list(counts.values())).pvalue > ALPHA
    picks = g.choice(10, 10, replace=False)
    assert sorted(picks) == list(range(10))


def test_rekeys_from_the_os(monkeypatch):
    monkeypatch.setattr(rngmod, "REKEY_BYTES", 1024)
    g = CsprngGenerator()
    first = g._stream
    g.random(100)  # 800 bytes: same key
    assert g._stream is first
    g.random(100)  # beyond 1024 bytes: new key
    assert g._stream is not first


def test_a_generator_built_before_fork_draws_new_noise_in_the_child():
    """Finding 7: a generator built before os.fork() (gunicorn --preload, multiprocessing's fork)
    produced the same noise in parent and child. The child now re-keys from the OS at the fork.
    (The Localizer's own generator: tests/client/test_localizer.py.)"""
    import multiprocessing

    from lac_testkit import draws_across_fork

    g = secure_generator()
    child, parent = draws_across_fork(lambda: g.random(4).tobytes())
    assert len(child) == len(parent) == 32 and child != parent

    # the same through multiprocessing's fork start method
    global _SHARED
    _SHARED = g  # inherited by the forked workers, not pickled
    with multiprocessing.get_context("fork").Pool(2) as pool:
        draws = pool.map(_draw, range(2))
    assert draws[0] != draws[1] and g.random(2).tobytes() not in draws


_SHARED = None


def _draw(_) -> bytes:
    return _SHARED.random(2).tobytes()


def test_one_generator_shared_by_threads_never_fails_nor_repeats():
    """Found by benchmarks/soak.py: two threads privatizing with one Localizer (one generator) made the ChaCha20
    stream fail ("RuntimeError: Already borrowed"), ending the caller's thread. Now each draw takes its own stretch
    of the keystream under a lock: 8 threads, 40 draws of 2^15 doubles each, no failure and no two draws alike."""
    import threading

    g = CsprngGenerator()
    draws: list[bytes] = []
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        try:
            for _ in range(40):
                draws.append(g.random(1 << 15).tobytes())
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:1]
    assert len(draws) == 320 and len(set(draws)) == 320
