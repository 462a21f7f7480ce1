import math

import numpy as np
import pytest
import scipy.sparse as sp

from lac.common.privacy import PrivacyUnit
from lac.curator.release.bayesian import (
    BayesianParams,
    bayesian_dp,
    bruteforce_gamma,
    decay_weights,
    log_mean_center,
)
from lac.curator.release.sound import SOUND_STATEMENT, cap_rows, sound_gamma


def _r(dense: np.ndarray, S: float, C: int, M: float = np.inf) -> np.ndarray:
    """w ⊙ x̂ computed densely from scratch (independent of the sparse code paths), totals clipped at M."""
    clamped = np.minimum(dense, C)
    c = np.minimum(clamped.sum(axis=0), M)
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
    S, C, W, V, M = 0.5, 2, 3, 10, 200
    for m in (1, 3):
        K = min(m * W, V)
        expect = min(1, m * S / C) * (1 - 1 / V) * math.log1p(M) * math.sqrt(K) + math.log1p(m * C) * math.sqrt(
            max(k * (1 - k / V) for k in range(K + 1))
        )
        assert sound_gamma(S, C, W, V, M, m) == pytest.approx(expect, rel=1e-10)
        assert sound_gamma(S, C, W, V, M, m) >= expect
    # the centering maximum is taken at k ≈ V/2 when W > V/2
    V2, W2 = 7, 100
    assert sound_gamma(S, C, W2, V2, M) >= math.log1p(C) * math.sqrt(max(k * (1 - k / V2) for k in range(V2 + 1)))
    for bad in [
        dict(S=0.0),
        dict(C=0),
        dict(W=0),
        dict(V=0),
        dict(count_clip=0),
        dict(C=True),
        dict(reports_per_user=0),
    ]:
        kw = dict(S=1.0, C=1, W=1, V=2, count_clip=2, reports_per_user=1) | bad
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
    g = sound_gamma(S, C, W, V, n_max * C)  # no clipping happens: totals are at most n·C
    assert bruteforce_gamma(U, S, C) <= g


def test_dominates_single_user_and_boundary_cases():
    for C in (1, 2, 5):
        for S in (C / 3, C / 2, C / 1.5, float(C), 3.0 * C):
            for V in (2, 3, 50):
                for W in (1, 2, 4):
                    # single user holding W rare items
                    dense = np.zeros((1, V), dtype=np.int64)
                    dense[0, : min(W, V)] = C
                    assert bruteforce_gamma(sp.csr_matrix(dense), S, C) <= sound_gamma(S, C, W, V, C)
                    # items exactly at the N = C/S boundary: ceil(C/S) users share item 0
                    k = max(1, math.ceil(C / S))
                    dense = np.zeros((k + 3, V), dtype=np.int64)
                    dense[:k, 0] = C
                    dense[k:, 1 % V] = C
                    dense[-1, : min(W, V)] = C
                    assert bruteforce_gamma(sp.csr_matrix(dense), S, C) <= sound_gamma(S, C, W, V, (k + 3) * C)


@pytest.mark.parametrize("seed", range(40))
def test_dominates_dense_add_one_user(seed):
    """Add an arbitrary user with up to m reports (not just remove a present one), with item totals
    clipped at M (often active here), and recompute r from scratch."""
    rng = np.random.default_rng(1000 + seed)
    C = int(rng.choice([1, 2, 4]))
    S = float(rng.choice([C / 3, C / 2.5, float(C), 0.2, 5.0]))
    V = int(rng.integers(2, 25))
    W = int(rng.integers(1, min(V, 6) + 1))
    m = int(rng.choice([1, 1, 2, 3]))
    n = int(rng.integers(0, 15))
    M = int(rng.choice([2, 5, 1000]))
    dense = _random_users(rng, n, V, W, C, rare_bias=True) if n else np.zeros((0, V), dtype=np.int64)
    g = sound_gamma(S, C, W, V, M, m)
    r0 = _r(dense, S, C, M) if n else np.zeros(V)  # no users: c = 0 -> x̂ = 0
    worst = 0.0
    for _ in range(30):
        user = []
        N = (dense > 0).sum(axis=0) if n else np.zeros(V)
        for _ in range(int(rng.integers(1, m + 1))):  # the user's reports
            k = int(rng.integers(1, W + 1))
            # new users prefer items nobody (or few) hold: the adversarial direction
            order = np.argsort(N + rng.random(V))
            items = order[:k] if rng.random() < 0.7 else rng.choice(V, size=k, replace=False)
            u = np.zeros(V, dtype=np.int64)
            u[items] = rng.integers(1, C + 1, size=k)
            user.append(u)
        r1 = _r(np.vstack([dense, *user]), S, C, M)
        worst = max(worst, float(np.linalg.norm(r1 - r0)))
    assert worst <= g


def test_bayesian_params_sound_wiring():
    with pytest.raises(ValueError):
        BayesianParams(epsilon=1.0, delta=1e-6, sensitivity="sound")
    with pytest.raises(ValueError):
        BayesianParams(epsilon=1.0, delta=1e-6, sensitivity="sound", W=0, count_clip=10)
    unit = PrivacyUnit.client(reports_per_window=2, windows=3, window_seconds=86400)
    p = BayesianParams(epsilon=1.0, delta=1e-6, W=3, count_clip=50, S=0.5, C=2, unit=unit)
    rng = np.random.default_rng(3)
    dense = _random_users(rng, 20, 12, 3, 2)
    rel = bayesian_dp(sp.csr_matrix(dense), np.arange(1, 13, dtype=float), p, rng=np.random.default_rng(4))
    assert rel.data_dependent is False and rel.guarantee.differentially_private
    assert SOUND_STATEMENT in rel.statement and "at most 6 in all" in rel.statement
    assert rel.sensitivity_method == "sound"
    assert rel.gamma == pytest.approx(sound_gamma(0.5, 2, 3, 12, 50, 6))
    assert np.isclose(np.exp(rel.log_theta).sum(), 1.0)


def test_caps_are_enforced_by_the_mechanism_never_by_an_error():
    """A report above W and any number of reports are fine: the mechanism cuts rows to W items and
    clips item totals, so no error (which would leak a data statistic) is ever raised for the data."""
    rng = np.random.default_rng(9)
    dense = _random_users(rng, 40, 12, 8, 2)
    p = BayesianParams(epsilon=1.0, delta=1e-6, W=2, count_clip=3, S=0.5, C=2)
    rel = bayesian_dp(sp.csr_matrix(dense), np.ones(12), p, rng=np.random.default_rng(0))
    capped = cap_rows(sp.csr_matrix(dense), 2)
    assert np.diff(capped.indptr).max() == 2
    c = np.minimum(np.minimum(capped.toarray(), 2).sum(axis=0), 3)
    N = (capped.toarray() > 0).sum(axis=0)
    want = 0.9 * decay_weights(N, 0.5, 2) * log_mean_center(c) + 0.1 * log_mean_center(np.ones(12))
    np.testing.assert_allclose(rel.mean, want, atol=1e-12)


def test_cap_rows_ignores_explicit_zeros_and_keeps_the_first_entries():
    U = sp.csr_matrix((np.array([1, 0, 2, 3]), (np.array([0, 0, 0, 1]), np.array([0, 1, 2, 0]))), shape=(2, 3))
    capped = cap_rows(U, 1)
    assert capped.toarray().tolist() == [[1, 0, 0], [3, 0, 0]]
