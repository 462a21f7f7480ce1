import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from lac.common.privacy import PrivacyUnit
from lac.curator.release.baselines import k_anonymity, laplace_dp, laplace_public_dp
from lac.curator.release.sound import cap_rows

FALSE_ALARM = 1e-3  # per KS test


def _users(seed=0, n=50, V=20, W=3, C=2):
    rng = np.random.default_rng(seed)
    dense = np.zeros((n, V), dtype=np.int64)
    for u in range(n):
        items = rng.choice(V, size=int(rng.integers(1, W + 1)), replace=False)
        dense[u, items] = rng.integers(1, 2 * C + 2, size=items.size)
    return dense


def test_laplace_noise_scale_ks():
    V, W, C, eps = 20000, 3, 2, 0.5
    U = sp.csr_matrix((1, V), dtype=np.int64)
    out = laplace_dp(U, W=W, C=C, epsilon=eps, rng=np.random.default_rng(0))
    assert out.scale == pytest.approx(W * C / eps) and out.sensitivity == W * C
    noise = np.asarray(out.noisy) - np.asarray(out.mean)
    assert stats.kstest(noise, "laplace", args=(0, W * C / eps)).pvalue > FALSE_ALARM
    # power: a scale off by 10% is rejected
    assert stats.kstest(noise, "laplace", args=(0, 1.1 * W * C / eps)).pvalue < FALSE_ALARM
    assert np.isclose(out.probs.sum(), 1.0) and np.all(out.probs >= 0)
    assert out.differentially_private and not out.data_dependent and out.delta == 0


def test_laplace_mean_is_clamped_counts_and_caps_enforced():
    dense = _users()
    out = laplace_dp(sp.csr_matrix(dense), W=3, C=2, epsilon=1e9, rng=np.random.default_rng(1))
    np.testing.assert_allclose(out.mean, np.minimum(dense, 2).sum(axis=0))
    np.testing.assert_allclose(out.probs, np.minimum(dense, 2).sum(axis=0) / np.minimum(dense, 2).sum(), atol=1e-6)
    # a report above W is cut to its first W items by the mechanism (no error: it would leak)
    cut = laplace_dp(sp.csr_matrix(dense), W=1, C=2, epsilon=1e9, rng=np.random.default_rng(1))
    np.testing.assert_allclose(cut.mean, np.minimum(cap_rows(sp.csr_matrix(dense), 1).toarray(), 2).sum(axis=0))
    with pytest.raises(ValueError):
        laplace_dp(sp.csr_matrix(dense), W=3, C=2, epsilon=0.0)


def test_user_level_sensitivity_covers_every_report_of_a_user():
    unit = PrivacyUnit.client(reports_per_window=2, windows=3, window_seconds=3600)
    out = laplace_dp(sp.csr_matrix(_users()), W=3, C=2, epsilon=1.0, rng=np.random.default_rng(0), unit=unit)
    assert out.sensitivity == 6 * 3 * 2 and out.scale == 36.0
    assert "at most 6 in all" in out.statement


def test_laplace_threshold_and_normalise():
    # everything noise: at tiny epsilon about half the items survive the threshold
    U = sp.csr_matrix((0, 1000), dtype=np.int64)
    out = laplace_dp(U, W=1, C=1, epsilon=1e-3, rng=np.random.default_rng(2))
    assert 0.4 < np.mean(out.probs > 0) < 0.6
    assert np.isclose(out.probs.sum(), 1.0)


def test_laplace_public_sound_and_observed():
    dense = _users(seed=3, n=100)
    alpha = np.arange(1, 21, dtype=float)
    U = sp.csr_matrix(dense)
    s = laplace_public_dp(U, alpha, W=3, C=2, epsilon=0.5, rng=np.random.default_rng(4))
    assert s.sensitivity == 2.0 and s.scale == pytest.approx(4.0) and not s.data_dependent
    c = np.minimum(dense, 2).sum(axis=0).astype(float)
    np.testing.assert_allclose(s.mean, c / c.sum())  # f + α̃ = c/‖c‖₁
    o = laplace_public_dp(U, alpha, W=3, C=2, epsilon=0.5, sensitivity="observed", rng=np.random.default_rng(4))
    assert o.sensitivity == pytest.approx(2 * 3 * 2 / c.sum()) and o.data_dependent
    assert o.statement.startswith("NOT differentially private") and not o.differentially_private
    # the observed ℓ1 sensitivity dominates removing any present user
    for u in range(dense.shape[0]):
        cu = np.minimum(np.delete(dense, u, axis=0), 2).sum(axis=0)
        assert np.abs(cu / cu.sum() - c / c.sum()).sum() <= o.sensitivity + 1e-12
    # KS on the noise
    big = laplace_public_dp(
        sp.csr_matrix((1, 20000), dtype=np.int64), np.ones(20000), W=1, C=1, epsilon=2.0, rng=np.random.default_rng(5)
    )
    assert stats.kstest(big.noisy - big.mean, "laplace", args=(0, 1.0)).pvalue > FALSE_ALARM
    with pytest.raises(ValueError):
        laplace_public_dp(U, alpha[:5], W=3, C=2, epsilon=1.0)


def test_paper_weighted_average_form():
    """Σ_n w_n(Δc̃ⁿ − α̃) with w_n = ‖Δcⁿ‖₁/‖c‖₁ equals c/‖c‖₁ − α̃ (what the code computes)."""
    dense = np.minimum(_users(seed=6, n=30), 2).astype(float)
    alpha = np.linspace(1, 5, dense.shape[1])
    at = alpha / alpha.sum()
    T = dense.sum()
    f = sum((row.sum() / T) * (row / row.sum() - at) for row in dense)
    out = laplace_public_dp(
        sp.csr_matrix(dense.astype(np.int64)), alpha, W=3, C=2, epsilon=1.0, rng=np.random.default_rng(0)
    )
    np.testing.assert_allclose(out.mean, f + at, atol=1e-12)


def test_kanon_exact():
    dense = np.array(
        [
            [1, 1, 0, 0, 5],
            [1, 0, 1, 0, 1],
            [1, 1, 0, 0, 0],
            [0, 1, 0, 3, 0],
        ]
    )
    out = k_anonymity(sp.csr_matrix(dense), K=2, C=2)
    # N = [3, 3, 1, 1, 2]; clamped totals = [3, 3, 1, 2, 3]; keep N >= 2 -> [3, 3, 0, 0, 3]
    np.testing.assert_allclose(out.probs, np.array([3, 3, 0, 0, 3]) / 9)
    out3 = k_anonymity(sp.csr_matrix(dense), K=3, C=2)
    np.testing.assert_allclose(out3.probs, [0.5, 0.5, 0, 0, 0])
    assert not out.differentially_private and "NOT differentially private" in out.statement
    assert math.isinf(out.epsilon)
    # nobody reaches K: uniform fallback
    np.testing.assert_allclose(k_anonymity(sp.csr_matrix(dense), K=10).probs, np.full(5, 0.2))
    with pytest.raises(ValueError):
        k_anonymity(sp.csr_matrix(dense), K=0)
