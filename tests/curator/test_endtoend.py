import math

import numpy as np
import pytest
import scipy.sparse as sp

from lac.curator.release.bayesian import BayesianParams, bayesian_dp, decay_weights, log_mean_center, prior_mean
from lac.curator.release.endtoend import EndToEndParams, cross_entropy_score, end_to_end_dp
from lac.curator.release.sound import SOUND_STATEMENT


def _data(seed=0, n=200, V=30, W=4, C=1):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1) ** 1.1
    p /= p.sum()
    rows, cols = [], []
    for u in range(n):
        items = rng.choice(V, size=int(rng.integers(1, W + 1)), replace=False, p=p)
        rows += [u] * items.size
        cols += list(items)
    U = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, V))
    alpha = np.round(5000 * p * rng.uniform(0.5, 1.5, V))
    return U, alpha


def test_cross_entropy_score_matches_definition():
    c = np.array([3.0, 0.0, 1.0])
    mu = np.array([0.5, -1.0, 2.0])
    expect = -sum(ci * (m - math.log(np.exp(mu).sum())) for ci, m in zip(c, mu))
    assert cross_entropy_score(c, mu) == pytest.approx(expect)


def test_budget_accounting_adds_up():
    U, alpha = _data()
    p = EndToEndParams(epsilon=1.2, delta=1e-6, S_grid=(0.1, 1.0), rho_grid=(0.5, 0.9), sensitivity="bruteforce")
    out = end_to_end_dp(U, alpha, p, rng=np.random.default_rng(1))
    assert out.epsilon_select == pytest.approx(1.2 / 3)
    assert out.epsilon_release == pytest.approx(2 * 1.2 / 3)
    assert out.epsilon == pytest.approx(1.2)
    assert out.release.params.epsilon == pytest.approx(out.epsilon_release)
    assert out.delta == out.release.params.delta == 1e-6
    in_val = np.random.default_rng(1).random(200) < 0.1  # one independent coin per report, drawn first
    assert out.n_validation == in_val.sum() and out.n_train == 200 - in_val.sum()
    assert out.release.n_users == out.n_train
    assert out.laplace_scale == pytest.approx(2 * out.delta_q / out.epsilon_select)
    assert out.data_dependent
    assert (out.S, out.rho) == out.grid[out.index]
    assert np.isclose(np.exp(out.release.log_theta).sum(), 1.0)


def test_selection_prefers_best_grid_point_when_noise_is_tiny():
    U, alpha = _data(seed=3, n=300)
    S_grid, rho_grid = (0.001, 0.1, 1.0, 100.0), (0.05, 0.5, 0.99)
    p = EndToEndParams(epsilon=1e12, delta=1e-6, S_grid=S_grid, rho_grid=rho_grid, sensitivity="bruteforce")
    rng = np.random.default_rng(7)
    out = end_to_end_dp(U, alpha, p, rng=rng)
    # recompute the exact scores independently from the same split
    in_val = np.random.default_rng(7).random(U.shape[0]) < 0.1
    U1, U2 = U[np.flatnonzero(in_val)], U[np.flatnonzero(~in_val)]
    c1 = np.asarray(U1.sum(axis=0)).ravel()
    c2 = np.asarray(U2.sum(axis=0)).ravel()
    N2 = np.asarray((U2 > 0).sum(axis=0)).ravel()
    xh = log_mean_center(c2)
    mp = prior_mean(alpha)
    exact = [cross_entropy_score(c1, r * decay_weights(N2, S, 1) * xh + (1 - r) * mp) for S in S_grid for r in rho_grid]
    np.testing.assert_allclose(out.scores, exact, rtol=1e-10)
    assert out.index == int(np.argmin(exact))
    assert len(set(np.round(exact, 6))) > 1  # the grid is not degenerate
    # the release equals BayesianDP run directly on the training part with the chosen (S, ρ)
    direct = bayesian_dp(
        U2, alpha, BayesianParams(epsilon=2e12 / 3, delta=1e-6, S=out.S, rho=out.rho, sensitivity="bruteforce")
    )
    np.testing.assert_allclose(out.release.mean, direct.mean)


def test_selection_is_noisy_at_small_epsilon():
    U, alpha = _data(seed=5, n=100)
    p = EndToEndParams(
        epsilon=0.01, delta=1e-6, S_grid=(0.01, 1.0, 100.0), rho_grid=(0.1, 0.9), sensitivity="bruteforce"
    )
    picks = {end_to_end_dp(U, alpha, p, rng=np.random.default_rng(s)).index for s in range(30)}
    assert len(picks) > 1


def test_sound_mode_is_data_independent():
    U, alpha = _data(seed=2, n=120, W=4)
    p = EndToEndParams(
        epsilon=1.0, delta=1e-6, S_grid=(0.5, 1.0), rho_grid=(0.5, 0.9), sensitivity="sound", W=4, count_clip=1000
    )
    a = end_to_end_dp(U, alpha, p, rng=np.random.default_rng(0))
    assert not a.data_dependent and not a.release.data_dependent
    assert SOUND_STATEMENT in a.statement
    # |Δq| depends on public values only: the same for a different data set with the same shape
    U2, _ = _data(seed=9, n=50, W=4)
    b = end_to_end_dp(U2, alpha, p, rng=np.random.default_rng(1))
    assert a.delta_q == b.delta_q
    with pytest.raises(ValueError):
        end_to_end_dp(U, alpha, EndToEndParams(epsilon=1.0, delta=1e-6, sensitivity="sound", W=1, count_clip=0))


def test_delta_q_dominates_removal_of_validation_users():
    """|Δq| (data-dependent mode) covers removing any present user from either part."""
    U, alpha = _data(seed=4, n=60)
    S_grid, rho_grid = (0.1, 1.0), (0.5, 0.9)
    p = EndToEndParams(epsilon=1.0, delta=1e-6, S_grid=S_grid, rho_grid=rho_grid, sensitivity="bruteforce")
    out = end_to_end_dp(U, alpha, p, rng=np.random.default_rng(11))
    in_val = np.random.default_rng(11).random(60) < 0.1
    idx1, idx2 = np.flatnonzero(in_val), np.flatnonzero(~in_val)
    assert idx1.size > 0

    def scores(i1, i2):
        c1 = np.asarray(U[i1].sum(axis=0)).ravel()
        U2 = U[i2]
        c2 = np.asarray(U2.sum(axis=0)).ravel()
        N2 = np.asarray((U2 > 0).sum(axis=0)).ravel()
        xh, mp = log_mean_center(c2), prior_mean(alpha)
        return np.array(
            [cross_entropy_score(c1, r * decay_weights(N2, S, 1) * xh + (1 - r) * mp) for S in S_grid for r in rho_grid]
        )

    base = scores(idx1, idx2)
    np.testing.assert_allclose(base, out.scores, rtol=1e-10)
    worst = 0.0
    for j in range(idx1.size):
        worst = max(worst, np.abs(scores(np.delete(idx1, j), idx2) - base).max())
    for j in range(idx2.size):
        worst = max(worst, np.abs(scores(idx1, np.delete(idx2, j)) - base).max())
    assert worst <= out.delta_q * (1 + 1e-9)


def test_split_does_not_depend_on_the_number_of_reports():
    """Regression (review finding 9): the validation split was round(0.1·n) reports, a function of n,
    which the composition argument assumes fixed. Now each report's side is its own coin: the same
    reports get the same sides whether or not more reports follow them."""
    U, alpha = _data(seed=6, n=300)
    p = EndToEndParams(epsilon=1e12, delta=1e-6, S_grid=(1.0,), rho_grid=(0.5,), sensitivity="bruteforce")
    small = end_to_end_dp(U[:100], alpha, p, rng=np.random.default_rng(3))
    big = end_to_end_dp(U, alpha, p, rng=np.random.default_rng(3))
    coins = np.random.default_rng(3).random(300) < 0.1
    assert small.n_validation == coins[:100].sum() and big.n_validation == coins.sum()
    assert "independent 10% coins per report" in big.statement
    # the share is 10% in expectation, not exactly: over many seeds it varies
    sizes = {end_to_end_dp(U[:100], alpha, p, rng=np.random.default_rng(s)).n_validation for s in range(20)}
    assert len(sizes) > 1 and 5 < np.mean(list(sizes)) < 15


def test_sound_mode_caps_the_validation_split():
    U, alpha = _data(seed=2, n=400, W=4)
    p = EndToEndParams(epsilon=1.0, delta=1e-6, S_grid=(0.5,), rho_grid=(0.5,), W=4, count_clip=1000, validation_cap=7)
    out = end_to_end_dp(U, alpha, p, rng=np.random.default_rng(0))
    assert out.n_validation == 7 and out.guarantee.differentially_private


def test_params_validation():
    with pytest.raises(ValueError):
        EndToEndParams(epsilon=1.0, delta=1e-6, S_grid=())
    with pytest.raises(ValueError):
        EndToEndParams(epsilon=1.0, delta=1e-6, rho_grid=(1.5,))
    with pytest.raises(ValueError):
        EndToEndParams(epsilon=1.0, delta=1e-6, sensitivity="sound")
    with pytest.raises(ValueError):
        EndToEndParams(epsilon=1.0, delta=1e-6, validation_fraction=1.0)
