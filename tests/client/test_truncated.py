"""Truncated mechanisms: exact output distribution (chi-square) and the stated guarantee.

Statistical checks: Pearson chi-square of sampled output counts against the probabilities
computed here independently from the stated formula (float64 brute-force distances), bins
with expected count < 5 pooled; each check rejects at p < 1e-3, so a correct implementation
fails each with probability 1e-3 under a fresh seed (seeds are fixed, so runs are
deterministic).
"""

from __future__ import annotations

import numpy as np
import pytest
from chisq import chi2_pvalue

from lac.client.localizer import OOV, Localizer
from lac.client.nearest import sqdist64
from lac.client.truncated import DistanceTruncated, KNNTruncated, default_tau

P_MIN = 1e-3


def _dist(emb, x):
    return np.sqrt(sqdist64(np.asarray(emb.vectors, np.float64), x))


def _formula_distance(emb, x, eps, tau):
    w = np.exp(-0.5 * eps * np.minimum(_dist(emb, x), tau))
    return w / w.sum()


def _formula_knn(emb, x, eps, k):
    d = _dist(emb, x)
    r = np.sort(d)[k - 1]
    w = np.exp(-0.5 * eps * np.minimum(d, r))
    return w / w.sum()


def _counts(mech, row, n, seed, size):
    out = mech.sample_ids(np.full(n, row), np.random.default_rng(seed))
    return np.bincount(out, minlength=size)


@pytest.mark.parametrize("word,eps,tau", [("king", 2.0, 4.0), ("the", 3.0, 3.0), ("city", 1.5, 4.5)])
def test_distance_truncated_matches_formula(glove_prefix, word, eps, tau):
    emb = glove_prefix(1000)
    mech = DistanceTruncated(emb, eps, tau)
    row = emb.index[word]
    probs = _formula_distance(emb, emb.vectors[row], eps, tau)
    np.testing.assert_allclose(mech.probabilities(emb.vectors[row][None])[0], probs, rtol=1e-5, atol=1e-15)
    assert chi2_pvalue(_counts(mech, row, 10_000, 11, emb.size), probs) > P_MIN


@pytest.mark.parametrize("word,eps,k", [("king", 3.0, 20), ("house", 2.0, 50)])
def test_knn_truncated_matches_formula(glove_prefix, word, eps, k):
    emb = glove_prefix(1000)
    mech = KNNTruncated(emb, eps, k)
    row = emb.index[word]
    probs = _formula_knn(emb, emb.vectors[row], eps, k)
    assert chi2_pvalue(_counts(mech, row, 10_000, 12, emb.size), probs) > P_MIN


def test_oov_is_perturbed_from_the_centroid(glove_prefix):
    emb = glove_prefix(1000)
    mech = DistanceTruncated(emb, 2.0, 4.0)
    probs = _formula_distance(emb, np.asarray(emb.centroid), 2.0, 4.0)
    assert chi2_pvalue(_counts(mech, OOV, 10_000, 13, emb.size), probs) > P_MIN


def test_residual_is_uniform_outside_the_admissible_area(glove200):
    mech = DistanceTruncated(glove200, 5.0, 3.5)
    x = glove200.vectors[7]
    p = mech.probabilities(x[None])[0]
    out = _dist(glove200, x) >= 3.5
    assert 0 < out.sum() < glove200.size
    np.testing.assert_allclose(p[out], p[out][0], rtol=1e-12)
    assert p[~out].min() >= p[out][0] * (1 - 1e-12)


def _pairwise(emb):
    v = np.asarray(emb.vectors, np.float64)
    return np.sqrt(sqdist64(v[:, None, :], v[None, :, :]))


def test_distance_truncated_guarantee_all_pairs(glove200):
    eps, tau = 4.0, 3.0
    mech = DistanceTruncated(glove200, eps, tau)
    logp = np.log(mech.probabilities(glove200.vectors))
    bound = eps * np.minimum(_pairwise(glove200), tau)
    # logp[x, y] - logp[x', y] <= bound[x, x'] for every x, x', y
    excess = (logp[:, None, :] - logp[None, :, :]) - bound[:, :, None]
    assert excess.max() <= 1e-6
    # and the bound is nearly attained somewhere (the analysis is not loose by a constant)
    assert (logp[:, None, :] - logp[None, :, :]).max() >= 0.5 * eps * tau


def test_knn_guarantee_all_pairs(glove200):
    eps, k = 4.0, 10
    mech = KNNTruncated(glove200, eps, k)
    logp = np.log(mech.probabilities(glove200.vectors))
    d = _pairwise(glove200)
    r = np.sort(d, axis=1)[:, k - 1]
    bound = eps * np.minimum(d, np.maximum(r[:, None], r[None, :]))
    assert ((logp[:, None, :] - logp[None, :, :]) - bound[:, :, None]).max() <= 1e-6
    assert mech.max_radius() >= r.max() - 1e-9


def test_localizer_integration_and_statement(glove_prefix):
    emb = glove_prefix(2000)
    tau = default_tau(emb)
    assert 0 < tau < emb.diameter()
    mech = DistanceTruncated(emb, 10.0, tau)
    loc = Localizer(emb, mech, np.random.default_rng(0))
    r = loc.privatize("the king said zqxvort")
    assert r.n_words == 4 and r.mechanism == "distance-truncated"
    assert all(w in emb.index for s in r.sentences for w in s)
    assert f"{4 * 10.0 * min(tau, emb.diameter()):.6g}" in r.statement and "τ" in r.statement
    assert loc.local_epsilon(4) == pytest.approx(4 * 10.0 * tau)
    knn = KNNTruncated(emb, 10.0, 5)
    st = Localizer(emb, knn, np.random.default_rng(0)).statement(3)
    assert "R_k" in st and knn.local_epsilon(3, emb.diameter()) <= 3 * 10.0 * emb.diameter()


def test_validation(glove200):
    with pytest.raises(ValueError):
        DistanceTruncated(glove200, 1.0, 0.0)
    with pytest.raises(ValueError):
        DistanceTruncated(glove200, -1.0, 1.0)
    with pytest.raises(ValueError):
        KNNTruncated(glove200, 1.0, 0)
    with pytest.raises(ValueError):
        KNNTruncated(glove200, 1.0, 201)


def test_chi_square_has_power(glove_prefix):
    """The same check rejects a factor-2 error in the exponent (exp(-ε·s) instead of exp(-ε·s/2))."""
    emb = glove_prefix(1000)
    mech = DistanceTruncated(emb, 1.0, 4.0)
    row = emb.index["king"]
    wrong = _formula_distance(emb, emb.vectors[row], 2.0, 4.0)
    assert chi2_pvalue(_counts(mech, row, 10_000, 14, emb.size), wrong) < P_MIN
