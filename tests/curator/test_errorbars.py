"""Error bars of a release (``lac.curator.release.errorbars``) on real text (the Lee news corpus's two halves: the
public prior and the users' sentences): the bootstrap reruns the release's own post-processing from its DP outputs,
leaves the release's noise untouched, and its intervals cover what the same post-processing gives the noise-free
totals as often as they say; likewise the Laplace baseline's closed form; every mechanism gets finite error bars
and a release that is not DP gets none, with the reason."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from curator_testkit import coverage, covers_nominally, normalised, posterior_coverage

from lac.common.privacy import ErrorBarMethod
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary, report_items
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.baselines import laplace_from_stats
from lac.curator.release.bayesian import count_stats
from lac.curator.release.building import PublicCaps, vocab_counts
from lac.curator.release.errorbars import Bootstrap, held_post_process, interval, laplace_errors
from lac.curator.release.posterior import PosteriorParams, WeightedTotals, posterior_release, weighted_totals
from lac.curator.runner.run import run


@functools.lru_cache(maxsize=2)
def _lee(max_items: int = 20_000) -> tuple[NgramVocabulary, list[list[list[str]]]]:
    """The release vocabulary (at most ``max_items`` n-grams) of the Lee corpus's public half, and its other half's
    sentences as the users' reports (three reports per sentence, as ``test_channel``'s users)."""
    import gensim

    path = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    sents = [list(s) for s in sentences(path.read_text(encoding="utf-8"))]
    vocab = NgramVocabulary.from_sentences(sents[::2], 3, 2, max_items, unknown_words=True)
    return vocab, [[s] for s in sents[1::2]] * 3


SMALL = 4_000  # the quick tests' vocabulary (2,668 unigrams, 1,023 bigrams, 309 trigrams)


def _totals(max_items: int = 20_000, candidates: bool = False) -> WeightedTotals:
    vocab, reports = _lee(max_items)
    return weighted_totals([report_items(reports, 3, vocab.words)], vocab, 100, 3, 1.0, candidates=candidates)


def test_the_bootstrap_reruns_the_release_post_processing_from_its_dp_outputs():
    """At the release's own noisy totals the bootstrap's post-processing (held fits, redraws side by side) gives the
    released pseudo-counts again, discovered n-grams included; an n-gram whose redrawn total falls below the DP
    threshold is not discovered in that draw."""
    vocab, _ = _lee(SMALL)
    totals = _totals(SMALL, candidates=True)
    pr = posterior_release(totals, vocab, PosteriorParams(20.0, 1e-6), np.random.default_rng(1))
    found = pr.items[len(vocab) :]
    assert pr.discovered > 0 and pr.found_noisy.size == len(found) and (pr.found_noisy > pr.threshold).all()
    again = held_post_process(
        pr.noisy_public[None], found, pr.found_noisy[None], pr.fits, vocab, pr.sigma, pr.threshold, None
    )[0]
    np.testing.assert_allclose(again, pr.pseudo_counts, rtol=1e-9)
    below = held_post_process(
        pr.noisy_public[None], found, np.full((1, len(found)), pr.threshold), pr.fits, vocab, pr.sigma, pr.threshold,
        None,
    )[0]  # fmt: skip
    assert (below[len(vocab) :] == 0).all()


def test_error_bars_leave_the_released_values_as_they_were():
    """The bootstrap draws from its own generator (``Bootstrap``, seeded from the OS unless given): a release with
    error bars has the same values as one without from the same release generator, and its error bars are finite
    on every n-gram (a seeded bootstrap gives the same ones again: ``test_channel``'s post-processing test)."""
    vocab, reports = _lee(SMALL)
    U = vocab_counts(iter([report_items(reports[:3000], 3, vocab.words)]), vocab, 3, 100)
    for mechanism in ("posterior", "bayesian", "laplace"):
        spec = ReleaseSpec(epsilon=5.0, mechanism=mechanism)
        plain = run(U, vocab, spec, PublicCaps(), rng=np.random.default_rng(4))
        with_bars = run(U, vocab, spec, PublicCaps(), rng=np.random.default_rng(4), errors=Bootstrap(draws=20))
        assert plain.errors is None and with_bars.errors is not None
        np.testing.assert_array_equal(with_bars.log_probs, plain.log_probs)
        e = with_bars.errors
        assert e.sd is not None and e.order_sd is not None
        assert np.isfinite(e.sd).all() and np.isfinite(e.order_sd).all() and (e.sd > 0).any()


@pytest.mark.slow
def test_the_posterior_intervals_cover_the_noise_free_release_as_often_as_they_say():
    """Six releases (ε = 1) of the users' fixed totals (11,610 real reports) with fresh Gaussian noise, each with
    its own bootstrap (100 draws, the default): the share of the 9,644 n-grams whose 90% interval holds the
    noise-free value (the same post-processing of the exact totals, with the empirical-Bayes prior the release
    fitted held) is in 85-95%, on the joint scale and within the order. Measured: 0.900 and 0.898, 0.009 between
    releases, so the mean of six (standard error ≈ 0.004 if releases are independent) leaves [0.85, 0.95] by chance
    with probability < 1e-9 (normal approximation, > 11 standard errors): a failure means the intervals are
    wrong. Intervals of half the width cover 0.64: the check fails them."""
    rates = posterior_coverage(_totals().public, 1.0, 6, _lee()[0])
    assert covers_nominally(rates["joint"]) and covers_nominally(rates["order"]), rates
    assert not covers_nominally(rates["half"]), rates


def test_the_laplace_intervals_cover_the_noise_free_distribution_as_often_as_they_say():
    """Twenty Laplace releases (ε = 10, scale b = 30) of the users' fixed clamped counts (total 153,135, its noise
    4,166): the share of n-grams whose 90% interval (Laplace quantiles of the closed-form standard deviation,
    centred on c̃/Σc̃) holds c/Σc is in 85-95%, on both scales, though the released (thresholded, renormalised)
    probabilities are biased low. Measured: 0.919 and 0.920 (an n-gram nobody wrote is covered 95% of the time,
    its interval cut at 0), 0.003 between releases, so a correct interval fails by chance with probability
    < 1e-9. Half-width intervals cover 0.74: the check fails them."""
    vocab, reports = _lee()
    stats = count_stats(vocab_counts(iter([report_items(reports, 3, vocab.words)]), vocab, 3, 100), 3)
    joint, order = normalised(stats.c, vocab.orders, False), normalised(stats.c, vocab.orders, True)
    rng = np.random.default_rng(7)
    rates: dict[str, list[float]] = {"joint": [], "order": [], "half": []}
    for _ in range(20):
        b = laplace_from_stats(stats, 100, 3, 10.0, rng)
        e = laplace_errors(b.noisy, b.scale, vocab.orders, None)
        assert e.bars.family == "laplace" and e.bars.method is ErrorBarMethod.CLOSED_FORM
        rates["joint"].append(coverage(e.center, e.sd, joint, "laplace"))
        rates["order"].append(coverage(e.order_center, e.order_sd, order, "laplace"))
        rates["half"].append(coverage(e.center, e.sd, joint, "laplace", width=0.5))
    assert covers_nominally(rates["joint"]) and covers_nominally(rates["order"]), rates
    assert not covers_nominally(rates["half"]), rates


def test_laplace_on_a_public_total_and_the_interval_quantiles():
    """Laplace with public data releases a distribution (its total, 1, is public): the standard deviation is √2·b
    exactly on the joint scale. A normal 90% interval is ±1.645 sd, a Laplace one ±ln(10)/√2 sd; cut to [0, 1]."""
    noisy = np.array([0.5, 0.3, -0.1, 0.3])
    e = laplace_errors(noisy, 0.05, np.array([1, 1, 2, 2]), known_total=1.0)
    np.testing.assert_allclose(e.sd, math.sqrt(2) * 0.05)
    np.testing.assert_array_equal(e.center, noisy)
    low, high = interval(np.array([0.5]), np.array([0.1]), "normal", 0.9)
    assert low[0] == pytest.approx(0.5 - 0.1644854, abs=1e-6) and high[0] == pytest.approx(0.6644854, abs=1e-6)
    low, high = interval(np.array([0.5]), np.array([0.1]), "laplace", 0.9)
    assert high[0] - 0.5 == pytest.approx(math.log(10) / math.sqrt(2) * 0.1)
    low, high = interval(np.array([0.01, 0.99]), np.array([0.1, 0.1]), "normal", 0.9)
    assert low.tolist()[0] == 0.0 and high.tolist()[1] == 1.0
    for bad in (0.0, 1.0, math.nan):
        with pytest.raises(ValueError, match="level"):
            interval(low, high, "normal", bad)


def test_a_release_that_is_not_dp_gets_no_error_bars_and_says_why():
    vocab, reports = _lee(SMALL)
    U = vocab_counts(iter([report_items(reports[:200], 3, vocab.words)]), vocab, 3, 100)
    for spec in (
        ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="claim1"),
        ReleaseSpec(epsilon=1.0, mechanism="laplace-public", public_sensitivity="observed"),
    ):
        r = run(U, vocab, spec, PublicCaps(), rng=np.random.default_rng(0), errors=Bootstrap())
        assert r.errors is not None and not r.errors.bars.stated and r.errors.sd is None
        assert "function of the data (NOT differentially private)" in r.errors.bars.statement()
    kanon = run(U, vocab, ReleaseSpec(epsilon=1.0, mechanism="kanon", K=2), PublicCaps(), errors=Bootstrap())
    assert kanon.errors is not None and "k-anonymity adds no noise" in kanon.errors.bars.statement()
