"""The default release mechanism (lac.curator.release.posterior): its sensitivity, noise, discovery
threshold and privacy map, each checked against an independent computation.

Statistical checks use fixed seeds; each KS / binomial check has false-alarm rate 1e-4 under a
fresh seed, and the checks meant to fail on a broken mechanism are shown failing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import log_ndtr

from lac.common.privacy import PrivacyUnit
from lac.curator.base.ngrams import NgramVocabulary, report_items
from lac.curator.release import posterior
from lac.curator.release.gaussian import analytic_sigma
from lac.curator.release.posterior import (
    _RATIO_GRID,
    NOISE_ONLY_TOTAL,
    PosteriorParams,
    WeightedTotals,
    clean_mass,
    discovery_threshold,
    eb_fit,
    eb_means,
    empirical_bayes,
    posterior_release,
    weighted_totals,
)

ALPHA = 1e-4
WORDS = np.array(
    ["the", "a", "dog", "fox", "sun", "is", "in", "walk", "we", "small", "zebra", "star", "park", "cat", "ran"]
)


def _reports(rng, n, max_sents=3, max_words=9):
    return [
        [list(rng.choice(WORDS, size=rng.integers(1, max_words))) for _ in range(rng.integers(1, max_sents))]
        for _ in range(n)
    ]


def _vocab(rng):
    return NgramVocabulary.from_sentences([list(rng.choice(WORDS, 8)) for _ in range(30)], max_n=3)


def _dense_totals(reports, W, C, tau, keys):
    """y per item string from first principles: each report's first W items, clamped, normalised."""
    from collections import Counter

    from lac.curator.base.ngrams import ngrams

    out = Counter()
    for rep in reports:
        counts, order = Counter(), []
        for s in rep:
            for g in ngrams(s, 3):
                if keys is not None and g not in keys:
                    continue
                if g not in counts:
                    order.append(g)
                counts[g] += 1
        kept = {g: min(counts[g], C) for g in order[:W]}
        norm = max(math.sqrt(sum(v * v for v in kept.values())), tau)
        for g, v in kept.items():
            out[g] += v / norm
    return out


@pytest.mark.parametrize("W,C,tau", [(100, 3, 1.0), (4, 1, 1.0), (7, 2, 5.0)])
def test_weighted_totals_match_a_direct_computation(W, C, tau):
    rng = np.random.default_rng(1)
    vocab = _vocab(rng)
    reports = _reports(rng, 200)
    blocks = [report_items(reports[:50], 3), report_items(reports[50:], 3)]
    got = weighted_totals(blocks, vocab, W, C, tau)
    want = _dense_totals(reports, W, C, tau, None)
    assert got.n_reports == 200
    np.testing.assert_allclose(got.public, [want.get(it, 0.0) for it in vocab.items], atol=1e-12)
    assert set(got.candidates) == {g for g in want if g not in vocab.index}
    for g, v in got.candidates.items():
        assert v == pytest.approx(want[g], abs=1e-12)
    # without discovery only the vocabulary's items are released, so only they share the weight and W
    only = weighted_totals(blocks, vocab, W, C, tau, candidates=False)
    want = _dense_totals(reports, W, C, tau, vocab.index)
    np.testing.assert_allclose(only.public, [want.get(it, 0.0) for it in vocab.items], atol=1e-12)
    assert not only.candidates and only.n_reports == 200


@pytest.mark.parametrize("candidates", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_one_users_reports_move_the_totals_by_at_most_m(seed, candidates):
    """The sensitivity the noise is calibrated to: adding a user's m reports changes the totals by at
    most m in ℓ2, by at most m per item, on at most m·W items (public and candidate alike)."""
    rng = np.random.default_rng(100 + seed)
    vocab = _vocab(rng)
    W, C, m = int(rng.integers(1, 30)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    base = _reports(rng, int(rng.integers(0, 40)))
    user = _reports(rng, m, max_sents=4, max_words=12)
    a = weighted_totals([report_items(base, 3)], vocab, W, C, 1.0, candidates=candidates)
    b = weighted_totals([report_items(base + user, 3)], vocab, W, C, 1.0, candidates=candidates)
    keys = sorted(set(a.candidates) | set(b.candidates))
    diff = np.concatenate([b.public - a.public, [b.candidates.get(k, 0) - a.candidates.get(k, 0) for k in keys]])
    assert np.linalg.norm(diff) <= m * (1 + 1e-12)
    assert diff.max() <= m + 1e-12 and np.count_nonzero(np.abs(diff) > 1e-15) <= m * W


def test_privacy_map_is_exact():
    p = PosteriorParams(epsilon=1.0, delta=1e-6, W=50, unit=PrivacyUnit.client(2, 3, 86400))
    assert p.m == 6 and p.delta_select == 5e-7 and p.delta_gauss == pytest.approx(5e-7)
    # the Gaussian part plus the discovery event compose to exactly the requested (ε, δ)
    assert p.epsilon_gauss + math.log(1 / (1 - p.delta_select)) == pytest.approx(1.0, abs=1e-15)
    assert p.sigma == analytic_sigma(6.0, p.epsilon_gauss, p.delta_gauss)
    rho = discovery_threshold(p.sigma, p.m, p.m * p.W, p.delta_select)
    # K items at the largest value m pass ρ with probability at most δ_s (union bound), not much less
    union = p.m * p.W * math.exp(log_ndtr(-(rho - p.m) / p.sigma))
    assert 0.999 * p.delta_select <= union <= p.delta_select
    no_discovery = PosteriorParams(epsilon=1.0, delta=1e-6, discovery=False)
    assert no_discovery.epsilon_gauss == 1.0 and no_discovery.delta_gauss == 1e-6
    with pytest.raises(ValueError):
        PosteriorParams(epsilon=1e-8, delta=0.5)  # nothing left for the Gaussian part


def test_noise_is_gaussian_with_the_stated_sigma():
    rng = np.random.default_rng(2)
    vocab = NgramVocabulary(tuple(f"w{i}" for i in range(20_000)), np.ones(20_000), 1)
    totals = WeightedTotals(np.linspace(0, 50, 20_000))
    r = posterior_release(totals, vocab, PosteriorParams(1.0, 1e-6, discovery=False), np.random.default_rng(3))
    z = (r.noisy_public - totals.public) / r.sigma
    assert stats.kstest(z, "norm").pvalue > ALPHA
    assert stats.kstest(z, "norm", args=(0, 1.1)).pvalue < ALPHA  # power: σ 10% too large is rejected
    assert r.guarantee.differentially_private and f"σ = {r.sigma:.6g}" in r.statement
    assert rng is not None


def test_discovery_keeps_a_users_unique_items_below_delta():
    """Monte Carlo of the bad event with a large δ_s (so it is measurable): a user whose K unique
    n-grams all sit at the maximum m passes the threshold with probability ≤ δ_s. The same check on a
    threshold without the union bound's K fails: the audit can fail."""
    sigma, m, K, delta_s, trials = 3.0, 2, 40, 0.05, 20_000
    rng = np.random.default_rng(4)

    def rate(rho):
        return np.mean((m + sigma * rng.standard_normal((trials, K)) > rho).any(axis=1))

    good = rate(discovery_threshold(sigma, m, K, delta_s))
    assert stats.binomtest(round(good * trials), trials, delta_s, alternative="greater").pvalue > ALPHA
    broken = rate(m + sigma * -stats.norm.ppf(delta_s))  # forgets the K items
    assert stats.binomtest(round(broken * trials), trials, delta_s, alternative="greater").pvalue < ALPHA


def test_discovery_releases_frequent_private_ngrams_only():
    rng = np.random.default_rng(5)
    vocab = NgramVocabulary(("the", "cat", "</s>"), np.array([10.0, 5.0, 8.0]), 3)
    totals = WeightedTotals(np.array([400.0, 200.0, 300.0]), {"cat sat": 300.0, "cat": 0.0, "rare thing": 0.5})
    totals.candidates.pop("cat")
    r = posterior_release(totals, vocab, PosteriorParams(1.0, 1e-6), rng)
    assert r.items[:3] == vocab.items and "cat sat" in r.items and "rare thing" not in r.items
    assert r.discovered == 1 and math.isfinite(r.threshold) and r.threshold > 26
    assert r.pseudo_counts.min() >= 0 and np.exp(r.log_probs).sum() == pytest.approx(1.0)


def test_empirical_bayes_moves_between_the_data_and_the_prior():
    rng = np.random.default_rng(6)
    prior = rng.gamma(0.5, 40.0, 5000) + 1e-3
    truth = prior * rng.lognormal(0, 0.8, 5000)
    # little noise: the posterior follows the data
    noisy = truth + rng.standard_normal(5000) * 0.01
    assert np.abs(empirical_bayes(noisy, prior, 0.01, 30) - truth).mean() < 0.05
    # overwhelming noise: the posterior falls back to the prior (better than the noisy values)
    noisy = truth + rng.standard_normal(5000) * 1e4
    post = empirical_bayes(noisy, prior, 1e4, 30)
    assert np.abs(post - truth).mean() < 0.1 * np.abs(np.maximum(noisy, 0) - truth).mean()
    assert (post >= 0).all()


def test_discovered_ngrams_are_released_in_an_order_independent_of_the_data():
    """Neighbouring datasets D and D' = D plus one report stored first see their candidates in different orders
    (the order of first occurrence); the release lists what it discovered in the same, sorted order for both."""
    vocab = NgramVocabulary(("the", "cat", "</s>"), np.array([10.0, 5.0, 8.0]), 3)
    D = [[["zebra", "runs"]]] * 200 + [[["apple", "pie"]]] * 200
    D_prime = [[["apple", "pie"]]] + D

    def discovered(reports, seed):
        totals = weighted_totals([report_items(reports, 3)], vocab, W=100, C=3, tau=1.0)
        r = posterior_release(totals, vocab, PosteriorParams(1.0, 1e-6), np.random.default_rng(seed))
        assert r.items[: len(vocab)] == vocab.items
        return list(totals.candidates), r.items[len(vocab) :]

    (seen, found), (seen_prime, found_prime) = discovered(D, 1), discovered(D_prime, 2)
    assert seen != seen_prime and seen[0].startswith("zebra") and seen_prime[0].startswith("apple")
    assert {"zebra runs", "apple pie"} <= set(found)
    assert found == found_prime == tuple(sorted(found))


def test_a_bin_whose_noisy_total_is_within_its_noise_keeps_the_prior(monkeypatch):
    """A Zipfian order whose true total (5,000) is well within its noise (σ = 40 on 20,000 items: the noisy total
    822, and the prior mass scaled to it, are below 2σ√items) keeps ratio 1 everywhere: no item lands 10× above its
    prior mean. Fitted instead, the mixture explains the noise's tail by items far above their prior (a third of the
    posterior's mass here). A prior mass well above the noise (50,000) is fitted: the total near 0 says the ratio is
    small, and the posterior keeps less than a third of the prior's mass."""
    rng = np.random.default_rng(1)
    n, sigma = 20_000, 40.0
    prior = 1.0 / np.arange(1, n + 1)
    truth = prior / prior.sum() * 5_000 * rng.lognormal(0, 0.8, n)
    noisy = truth + sigma * rng.standard_normal(n)
    assert noisy.sum() <= NOISE_ONLY_TOTAL * sigma * math.sqrt(n)
    mu = prior * max(noisy.sum(), 1.0) / prior.sum()

    def far_above(eb) -> float:
        post = eb_means(eb, noisy, sigma)
        return float(post[post > 10 * mu].sum() / post.sum())

    eb = eb_fit(noisy, mu, sigma, 30)
    assert [int(np.argmax(w)) for _, w in eb.bins] == [int(np.argmin(np.abs(np.log(_RATIO_GRID))))]
    assert far_above(eb) == 0.0
    big = prior * 50_000 / prior.sum()
    assert eb_means(eb_fit(noisy, big, sigma, 30), noisy, sigma).sum() < big.sum() / 3
    monkeypatch.setattr(posterior, "NOISE_ONLY_TOTAL", -math.inf)
    assert far_above(eb_fit(noisy, mu, sigma, 30)) > 0.2


def test_a_clean_estimate_keeps_the_noisy_total_of_what_the_channel_never_produced():
    """Items the channel never produced (pushed-through prior 0) keep max(noisy, 0) in the posterior; the mass a
    clean estimate is kept at counts their noisy total instead (unbiased), not the noise's positive half."""
    denoised = np.array([10.0, 20.0, 3.0, 0.0, 5.0])
    noisy = np.array([9.0, 21.0, 3.0, -4.0, 5.0])
    mu = np.array([8.0, 19.0, 0.0, 0.0, 0.0])
    assert clean_mass(denoised, noisy, mu) == 30.0 + 4.0
    assert clean_mass(denoised[None].repeat(2, 0), noisy[None].repeat(2, 0), mu).tolist() == [34.0, 34.0]
    assert clean_mass(denoised, noisy - np.array([0, 0, 9, 0, 0]), mu) == 30.0  # their noisy total below 0: none
