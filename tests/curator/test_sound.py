import math

import numpy as np
import pytest
import scipy.sparse as sp

from lac.curator.bayesian import (
    BayesianParams,
    bayesian_dp,
    bruteforce_gamma,
    decay_weights,
    log_mean_center,
)
from lac.curator.sound import SOUND_STATEMENT, check_public_caps, sound_gamma


def _r(dense: np.ndarray, S: float, C: int) -> np.ndarray:
    """w ⊙ x̂ computed densely from scratch (independent of the sparse code paths)."""
    clamped = np.minimum(dense, C)
    c = clamped.sum(axis=0)
    N = (dense > 0).sum(axis=0)
    return decay_weights(N, S, C) * log_mean_center(c)


def _random_users(rng, n, V, W, C, rare_bias=False):
    rows = np.zeros((n, V), dtype=np.int64)
    for u in range(n):
        k = rng.integers(1, W + 1)
        if rare_bias and rng.random() < 0.5:
            items = rng.choice(min(V, k + 2), size=min(k, V), replace=False) + (V - min(V, k + 2))
        else:
            items = rng.choice(V, size=min(k, V), replace=False)
        rows[u, items] = rng.integers(1, 3 * C + 1, size=items.size)
    return rows


def test_formula_pieces():
    # V = 1: x̂ ≡ 0, nothing can leak.
    assert sound_gamma(1.0, 1, 5, 1, 1000) == 0.0
    S, C, W, V, n = 0.5, 2, 3, 10, 100
    beta = min(1, S / C)
    expect = beta * (1 - 1 / V) * math.log1p((n - 1) * C) * math.sqrt(W) + math.log1p(C) * math.sqrt(
        max(k * (1 - k / V) for k in range(0, W + 1)))
    assert sound_gamma(S, C, W, V, n) == pytest.approx(expect, rel=1e-10)
    assert sound_gamma(S, C, W, V, n) >= expect
    # the centering maximum is taken at k ≈ V/2 when W > V/2
    V2, W2 = 7, 100
    assert sound_gamma(S, C, W2, V2, n) >= math.log1p(C) * math.sqrt(max(k * (1 - k / V2) for k in range(V2 + 1)))
    for bad in [dict(S=0.0), dict(C=0), dict(W=0), dict(V=0), dict(n_max=0), dict(C=True)]:
        kw = dict(S=1.0, C=1, W=1, V=2, n_max=2) | bad
        with pytest.raises(ValueError):
            sound_gamma(**kw)


@pytest.mark.parametrize("seed", range(25))
def test_dominates_bruteforce_on_adversarial_inputs(seed):
    rng = np.random.default_rng(seed)
    C = int(rng.choice([1, 2, 3, 10]))
    # S chosen so C/S is an integer, a non-integer, or < 1 (w saturates immediately)
    S = float(rng.choice([C / 3, C / 2.5, C, 2.0 * C, 0.01 * C, 0.37]))
    V = int(rng.integers(2, 40))
    W = int(rng.integers(1, 6))
    n = int(rng.integers(1, 30))
    n_max = n + int(rng.integers(0, 3))
    dense = _random_users(rng, n, V, W, C, rare_bias=bool(seed % 2))
    U = sp.csr_matrix(dense)
    g = sound_gamma(S, C, W, V, n_max)
    assert bruteforce_gamma(U, S, C) <= g


def test_dominates_single_user_and_boundary_cases():
    for C in (1, 2, 5):
        for S in (C / 3, C / 2, C / 1.5, float(C), 3.0 * C):
            for V in (2, 3, 50):
                for W in (1, 2, 4):
                    # single user holding W rare items
                    dense = np.zeros((1, V), dtype=np.int64)
                    dense[0, : min(W, V)] = C
                    assert bruteforce_gamma(sp.csr_matrix(dense), S, C) <= sound_gamma(S, C, W, V, 1)
                    # items exactly at the N = C/S boundary: ceil(C/S) users share item 0
                    k = max(1, math.ceil(C / S))
                    dense = np.zeros((k + 3, V), dtype=np.int64)
                    dense[:k, 0] = C
                    dense[k:, 1 % V] = C
                    dense[-1, : min(W, V)] = C
                    assert bruteforce_gamma(sp.csr_matrix(dense), S, C) <= sound_gamma(S, C, W, V, k + 3)


@pytest.mark.parametrize("seed", range(40))
def test_dominates_dense_add_one_user(seed):
    """Add an arbitrary user (not just remove a present one) and recompute r from scratch."""
    rng = np.random.default_rng(1000 + seed)
    C = int(rng.choice([1, 2, 4]))
    S = float(rng.choice([C / 3, C / 2.5, float(C), 0.2, 5.0]))
    V = int(rng.integers(2, 25))
    W = int(rng.integers(1, min(V, 6) + 1))
    n = int(rng.integers(0, 15))
    dense = _random_users(rng, n, V, W, C, rare_bias=True) if n else np.zeros((0, V), dtype=np.int64)
    g = sound_gamma(S, C, W, V, n + 1)
    r0 = _r(dense, S, C) if n else np.zeros(V)  # no users: c = 0 -> x̂ = 0
    worst = 0.0
    for _ in range(30):
        k = int(rng.integers(1, W + 1))
        # new users prefer items nobody (or few) hold: the adversarial direction
        N = (dense > 0).sum(axis=0) if n else np.zeros(V)
        order = np.argsort(N + rng.random(V))
        items = order[:k] if rng.random() < 0.7 else rng.choice(V, size=k, replace=False)
        u = np.zeros((1, V), dtype=np.int64)
        u[0, items] = rng.integers(1, C + 1, size=k)
        r1 = _r(np.vstack([dense, u]), S, C)
        worst = max(worst, float(np.linalg.norm(r1 - r0)))
    assert worst <= g


def test_bayesian_params_sound_wiring():
    with pytest.raises(ValueError):
        BayesianParams(epsilon=1.0, delta=1e-6, sensitivity="sound")
    with pytest.raises(ValueError):
        BayesianParams(epsilon=1.0, delta=1e-6, sensitivity="sound", W=0, n_max=10)
    p = BayesianParams(epsilon=1.0, delta=1e-6, sensitivity="sound", W=3, n_max=50, S=0.5, C=2)
    rng = np.random.default_rng(3)
    dense = _random_users(rng, 20, 12, 3, 2)
    rel = bayesian_dp(sp.csr_matrix(dense), np.arange(1, 13, dtype=float), p, rng=np.random.default_rng(4))
    assert rel.data_dependent is False
    assert SOUND_STATEMENT in rel.statement
    assert rel.sensitivity_method == "sound"
    assert rel.gamma == pytest.approx(sound_gamma(0.5, 2, 3, 12, 50))
    assert rel.gamma >= bruteforce_gamma(sp.csr_matrix(dense), 0.5, 2)
    assert np.isclose(np.exp(rel.log_theta).sum(), 1.0)
    # caps are enforced
    with pytest.raises(ValueError, match="n_max"):
        bayesian_dp(sp.csr_matrix(dense), np.ones(12), BayesianParams(
            epsilon=1.0, delta=1e-6, sensitivity="sound", W=3, n_max=5))
    with pytest.raises(ValueError, match="W="):
        bayesian_dp(sp.csr_matrix(dense), np.ones(12), BayesianParams(
            epsilon=1.0, delta=1e-6, sensitivity="sound", W=1, n_max=50))


def test_check_public_caps_ignores_explicit_zeros():
    U = sp.csr_matrix((np.array([1, 0, 0]), (np.array([0, 0, 0]), np.array([0, 1, 2]))), shape=(1, 3))
    check_public_caps(U, 1, 1)
