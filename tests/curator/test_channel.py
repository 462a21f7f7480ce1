"""Channel-aware estimation (``lac.curator.release.channel``): the users' clean statistics from a DP release
of their perturbed reports, on real text (the Lee news corpus) perturbed by the SDK's real mechanism."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
from curator_testkit import covers_nominally, posterior_coverage
from scipy import stats

from lac.client.embedding import glove_default
from lac.client.localizer import Localizer
from lac.client.mechanisms import MultivariateLaplace
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary, report_items
from lac.curator.release.channel import (
    ITEM_FALSE_ALARM,
    MIN_DRAWS,
    MIN_KEEP_SHARE,
    NgramChannel,
    WordChannel,
    channel_draws,
    deconvolve,
    item_estimate,
    public_unk_words,
    stands_out,
    word_channel,
)
from lac.curator.release.errorbars import Bootstrap, held_post_process, posterior_errors
from lac.curator.release.posterior import (
    PosteriorParams,
    WeightedTotals,
    clean_estimate,
    deconvolution_target,
    eb_fit,
    eb_means,
    post_process,
    posterior_release,
    public_masses,
    weighted_totals,
)

EPS = 8.0


@functools.lru_cache(maxsize=1)
def _lee() -> tuple[list[list[str]], list[list[str]]]:
    import gensim

    path = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    sents = [list(s) for s in sentences(path.read_text(encoding="utf-8"))]
    return sents[::2], sents[1::2]  # public half, users' half


pytestmark = pytest.mark.slow  # the channel is sampled once for the module (10-30 s)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    public, users = _lee()
    vocab = NgramVocabulary.from_sentences(public, 3, 2, 20_000, unknown_words=True)
    emb = glove_default(50_000)
    rng = np.random.default_rng(11)
    word = word_channel(vocab, emb, MultivariateLaplace(EPS), public_unk_words(public, vocab), draws=100, rng=rng)
    channel = NgramChannel.build(word, vocab)
    loc = Localizer(emb, MultivariateLaplace(EPS), rng=rng, calibrated=True)
    reports = [[list(s) for s in r.sentences] for r in loc.privatize_many([" ".join(s) + "." for s in users] * 3)]
    clean = [[s] for s in users] * 3
    return vocab, word, channel, clean, reports


def _totals(reports, vocab, candidates=False) -> WeightedTotals:
    return weighted_totals([report_items(reports, 3, vocab.words)], vocab, 100, 3, 1.0, candidates=candidates)


def _kl(p, q) -> float:
    p, q = p / p.sum(), np.maximum(q, 1e-12) / np.maximum(q, 1e-12).sum()
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def test_word_channel_rows_are_distributions_and_boundaries_pass_unchanged(setup):
    vocab, word, *_ = setup
    rows = np.asarray(word.matrix.sum(axis=1)).ravel()
    assert np.allclose(rows, 1.0)
    cid = {c: i for i, c in enumerate(word.classes)}
    for t in ("<s>", "</s>"):
        assert word.matrix[cid[t], cid[t]] == 1.0
    assert 0.2 < float(np.median(word.keep_rate())) < 0.9  # ε = 8 keeps about half the words
    # draws by public frequency: 100 per word on average (<unk> included; a little more where words read as one
    # embedding row share the most any of them gets), at least MIN_DRAWS each
    sampled = word.row_draws[[cid[w] for w in (*vocab.words, "<unk>")]]
    assert word.draws == 100 and 100 <= sampled.mean() <= 105 and sampled.min() == word.least_draws > MIN_DRAWS
    assert sampled.max() > 1000  # the most frequent words (and <unk>) get the most
    assert word.standard_error == pytest.approx(0.5 / np.sqrt(word.least_draws))
    assert f"{word.least_draws}–{sampled.max()} draws per word (100 on average, shared by public frequency)" in (
        word.describe()
    )


def test_draws_are_shared_by_public_frequency_over_a_floor():
    counts = np.array([0.0, 1.0, 4.0, 100.0, 10_000.0])
    d = channel_draws(counts, mean=200, least=MIN_DRAWS)
    assert d[0] == MIN_DRAWS and np.all(np.diff(d) > 0)
    assert 200 * counts.size <= d.sum() <= 200 * counts.size + counts.size  # the budget, rounded up per word
    # above the floor: half of the rest ∝ count, half ∝ √count
    rest = (200 - MIN_DRAWS) * counts.size
    expect = MIN_DRAWS + rest * (0.5 * counts / counts.sum() + 0.5 * np.sqrt(counts) / np.sqrt(counts).sum())
    assert np.allclose(d, expect, atol=1.0)
    assert np.array_equal(channel_draws(counts, mean=40, least=40), np.full(5, 40))
    assert np.array_equal(channel_draws(np.zeros(3), mean=70), np.full(3, 70))


def test_each_rows_stated_error_bound_holds_and_the_test_can_fail(setup):
    """The keep rate P(w → w) of the 20 words with the fewest draws and the 20 with the most, against an
    independent reference of 4,000 draws of each: |difference| / √(bound² + reference bound²), the bound being
    the row's stated 0.5/√draws (≥ its real standard error), stays under the two-sided normal quantile of α/40
    (Bonferroni over the 40 rows): false-alarm rate ≤ α = 0.001. A channel stating 20 times its real draws
    (bounds √20 times too small) fails the same check."""
    from lac.client.channel import sample_channel

    vocab, word, *_ = setup
    emb = glove_default(50_000)
    cid = {c: i for i, c in enumerate(word.classes)}
    words = sorted((w for w in vocab.words if w in emb.index), key=lambda w: (word.row_draws[cid[w]], w))
    check = words[:20] + words[-20:]
    assert word.row_draws[cid[check[0]]] < word.row_draws[cid[check[-1]]]
    rows = np.array([emb.index[w] for w in check])
    ref_draws = 4000
    ref = sample_channel(emb, MultivariateLaplace(EPS), rows, ref_draws, np.random.default_rng(12))
    ref_keep = (
        np.array(
            [
                ref.counts[ref.indptr[i] : ref.indptr[i + 1]][ref.cols[ref.indptr[i] : ref.indptr[i + 1]] == r].sum()
                for i, r in enumerate(rows)
            ]
        )
        / ref_draws
    )
    keep = np.array([word.matrix[cid[w], cid[w]] for w in check])
    bound = word.row_standard_error()[[cid[w] for w in check]]
    critical = stats.norm.isf(0.001 / 2 / len(check))

    def worst(stated: np.ndarray) -> float:
        return float(np.max(np.abs(keep - ref_keep) / np.sqrt(stated**2 + 0.25 / ref_draws)))

    assert worst(bound) < critical
    assert worst(bound / np.sqrt(20)) >= critical


def test_word_channel_round_trips_through_its_file(setup, tmp_path):
    _, word, *_ = setup
    word.save(tmp_path / "c.npz")
    back = WordChannel.load(tmp_path / "c.npz")
    assert back.classes == word.classes and back.draws == word.draws and back.deployment_key == word.deployment_key
    assert np.array_equal(back.row_draws, word.row_draws)
    assert (back.matrix != word.matrix).nnz == 0


def test_ngram_channel_is_the_product_of_word_channels(setup):
    vocab, word, channel, *_ = setup
    cid = {c: i for i, c in enumerate(word.classes)}
    P = word.matrix.toarray()
    rng = np.random.default_rng(3)
    for n in (1, 2, 3):
        A = channel.order(n, vocab).toarray()
        cols = channel.columns[n]
        toks = [[cid[t] for t in vocab.items[c].split(" ")] for c in cols]
        for _ in range(200):
            j, k = rng.integers(0, cols.size, size=2)
            assert A[k, j] == pytest.approx(np.prod([P[a, b] for a, b in zip(toks[j], toks[k])]))
    other = NgramVocabulary(vocab.items[:10], vocab.alpha[:10], 3)
    with pytest.raises(ValueError, match="another release vocabulary"):
        channel.order(1, other)


def _raw_totals(reports, vocab) -> np.ndarray:
    """Each public item's raw count over ``reports`` (every occurrence counted once, no per-report weights)."""
    ri = report_items(reports, 3, vocab.words)
    per_item = np.bincount(ri.item_ids, weights=ri.counts, minlength=len(ri.items))
    index = {it: i for i, it in enumerate(vocab.items)}
    out = np.zeros(len(vocab))
    for it, c in zip(ri.items, per_item, strict=True):
        if it in index:
            out[index[it]] += c
    return out


def test_deconvolution_recovers_most_of_what_the_devices_changed(setup):
    """Public and users' text come from one corpus here, so the prior is already close; the deconvolved
    words must be closer to the clean ones than the prior and far closer than the perturbed counts are.
    Raw counts: the variance the deconvolution assumes for the devices' random choices (Poisson, one per
    occurrence) is theirs."""
    vocab, word, channel, clean, reports = setup
    uni = vocab.orders == 1
    clean_y = _raw_totals(clean, vocab)[uni]
    pert_y = _raw_totals(reports, vocab)[uni]
    sigma = 1.0
    noisy = pert_y + sigma * np.random.default_rng(5).standard_normal(pert_y.size)
    prior = vocab.alpha[uni] / vocab.alpha[uni].sum()
    d = deconvolve(noisy, channel.order(1, vocab), prior, sigma)
    assert d.iterations > 0 and d.discrepancy < d.start_discrepancy
    kl_dec, kl_pert, kl_prior = _kl(clean_y, d.clean), _kl(clean_y, pert_y), _kl(clean_y, prior)
    assert kl_dec < 0.5 * kl_pert and kl_dec < kl_prior, (kl_dec, kl_pert, kl_prior)


def test_noise_that_swamps_the_signal_leaves_the_prior(setup):
    vocab, _, channel, _, reports = setup
    uni = vocab.orders == 1
    pert_y = _totals(reports, vocab).public[uni]
    sigma = 1e6
    noisy = pert_y + sigma * np.random.default_rng(6).standard_normal(pert_y.size)
    prior = vocab.alpha[uni] / vocab.alpha[uni].sum()
    d = deconvolve(noisy, channel.order(1, vocab), prior, sigma)
    assert d.iterations == 0
    assert np.allclose(d.clean / d.clean.sum(), prior)


class _Normals:
    """A RandomSource whose standard normals are given: to hold a release's noisy outputs fixed."""

    def __init__(self, z: np.ndarray) -> None:
        self.z = z

    def standard_normal(self, size=None):
        return self.z[: int(np.prod(size))].reshape(size)


def test_the_clean_estimate_is_post_processing_of_the_noisy_totals_alone(setup):
    """Two different datasets whose noisy totals come out equal get equal releases: the channel-aware
    estimate reads nothing but the Gaussian mechanism's outputs and public data."""
    vocab, _, channel, clean, reports = setup
    p = PosteriorParams(1.0, 1e-6, discovery=False)
    a, b = _totals(reports, vocab), _totals(reports[: len(reports) // 2], vocab)
    z = np.random.default_rng(7).standard_normal(len(vocab))
    ra = posterior_release(a, vocab, p, _Normals(z), channel=channel)
    rb = posterior_release(b, vocab, p, _Normals(z + (a.public - b.public) / p.sigma), channel=channel)
    assert np.allclose(ra.noisy_public, rb.noisy_public)
    assert np.array_equal(ra.pseudo_counts, rb.pseudo_counts)
    pseudo, _, _ = post_process(ra.noisy_public, [], np.empty(0), vocab, p.sigma, p.bins, channel, p.occurrence_weight)
    assert np.array_equal(pseudo, ra.pseudo_counts)
    # so are its error bars: the bootstrap reads the same DP outputs, fits and public data, never the totals
    bars = [
        posterior_errors(
            r.noisy_public, [], r.found_noisy, r.pseudo_counts, r.fits, vocab, r.sigma, r.threshold, channel,
            Bootstrap(draws=50, seed=11),
        )
        for r in (ra, rb)
    ]  # fmt: skip
    for name in ("center", "sd", "order_center", "order_sd"):
        assert np.array_equal(getattr(bars[0], name), getattr(bars[1], name)), name
    assert bars[0].bars == bars[1].bars and "the public local channel" in bars[0].bars.statement()
    # the guarantee is the Gaussian mechanism's, whatever the post-processing; the statement says what ran
    plain = posterior_release(a, vocab, p, _Normals(z))
    assert ra.guarantee.budget == plain.guarantee.budget
    assert "deconvolved with the public local channel" in ra.statement and ra.channel
    assert "local channel" not in plain.statement and not plain.channel


def test_the_clean_estimate_splits_its_mass_between_orders_as_the_public_corpus_does(setup):
    """Perturbation breaks word sequences: far fewer of the perturbed reports' bigrams and trigrams are public
    n-grams than the clean text's, and the channel-blind release keeps that split. The clean estimate releases each
    order (discovered n-grams included) at the public corpus's share (longer n-grams' counts discounted: the
    vocabulary was chosen from that text), which is closer to the clean text's; where the data are strong the lowest
    order keeps its own strength."""
    vocab, _, channel, clean, reports = setup
    orders = vocab.orders
    shares = lambda c, o: np.array([c[o == n].sum() for n in (1, 2, 3)]) / c.sum()  # noqa: E731
    masses = public_masses(vocab, (1, 2, 3), clean=True)
    public = np.array([masses[n] for n in (1, 2, 3)]) / sum(masses.values())
    clean_s, pert_s = shares(_raw_totals(clean, vocab), orders), shares(_raw_totals(reports, vocab), orders)
    assert np.all(np.abs(public - clean_s)[1:] < np.abs(pert_s - clean_s)[1:]), (public, clean_s, pert_s)
    p = PosteriorParams(8.0, 1e-6)  # strong data: the unigrams' pseudo-counts outweigh a quarter of the prior's
    totals = _totals(reports * 4, vocab, candidates=True)
    aware = posterior_release(totals, vocab, p, np.random.default_rng(8), channel=channel)
    blind = posterior_release(totals, vocab, p, np.random.default_rng(8))
    rel_orders = np.array([it.count(" ") + 1 for it in aware.items])
    assert np.allclose(shares(aware.pseudo_counts, rel_orders), public, rtol=1e-9)
    blind_orders = np.array([it.count(" ") + 1 for it in blind.items])
    assert abs(shares(blind.pseudo_counts, blind_orders)[1] - public[1]) > 0.02  # the perturbed reports' bigrams
    uni = orders == 1
    assert aware.pseudo_counts[: len(vocab)][uni].sum() > 0.25 * vocab.alpha[uni].sum() * 1.01
    assert "How the mass splits between n-gram orders is the public corpus's" in aware.statement


def test_the_channel_aware_intervals_cover_the_noise_free_estimate_as_often_as_they_say(setup):
    """Six channel-aware releases (ε = 1) of fixed perturbed totals (the fixture's 11,610 reports' totals scaled by
    10, as 116,100 reports would give: with fewer the deconvolution stays at the prior) with fresh Gaussian noise,
    each with its own bootstrap (100 draws): the share of n-grams whose 90% interval holds the noise-free value
    (the same post-processing of the exact totals, the release's empirical-Bayes prior, EM start and number of steps
    held) is in 85-95% on both scales. Measured: 0.904 and 0.895, 0.007 and 0.011 between releases, so a correct
    interval fails by chance with probability < 1e-9 (> 11 standard errors of the mean of six); half-width
    intervals cover 0.66 and fail."""
    vocab, _, channel, _, reports = setup
    rates = posterior_coverage(_totals(reports, vocab).public * 10, 1.0, 6, vocab, channel)
    assert covers_nominally(rates["joint"]) and covers_nominally(rates["order"]), rates
    assert not covers_nominally(rates["half"]), rates


def test_a_channel_that_keeps_too_few_words_releases_the_public_prior_and_says_so(setup):
    vocab, _, channel, _, reports = setup
    assert channel.keep > MIN_KEEP_SHARE and channel.informative  # ε = 8 keeps about 40% of the words
    noisy_channel = dataclasses.replace(channel, keep=0.1)
    assert not noisy_channel.informative
    r = posterior_release(
        _totals(reports, vocab, candidates=True), vocab, PosteriorParams(1.0, 1e-6), None, noisy_channel
    )
    assert np.array_equal(r.pseudo_counts, vocab.alpha) and r.items == vocab.items and r.discovered == 0
    assert "too few for the users' clean statistics to be estimated" in r.statement


def test_the_ngram_channel_is_cached_exactly(setup, tmp_path, monkeypatch, caplog):
    """A curator reads its n-gram channel back from the cache (built once per word channel and vocabulary):
    the same matrices bit for bit; another word channel or vocabulary is another file; an unreadable file is
    built again, with a warning."""
    vocab, word, channel, _, _ = setup
    first = NgramChannel.cached(tmp_path, word, vocab)
    (path,) = tmp_path.glob("ngram-channel-*.npz")

    def no_build(*args, **kwargs):
        raise AssertionError("built, not read from the cache")

    with monkeypatch.context() as m:
        m.setattr(NgramChannel, "build", no_build)
        again = NgramChannel.cached(tmp_path, word, vocab)
    for got in (first, again):
        assert got.keep == channel.keep and got.columns.keys() == channel.matrices.keys()
        for n, A in channel.matrices.items():
            assert np.array_equal(got.columns[n], channel.columns[n])
            B = got.matrices[n]
            assert B.shape == A.shape and (B != A).nnz == 0 and B.dtype == A.dtype
    other = NgramVocabulary.from_sentences(_lee()[0], 2, 2, 5_000, unknown_words=True)
    other_word = word_channel(
        other, glove_default(50_000), MultivariateLaplace(EPS), [], draws=20, rng=np.random.default_rng(1)
    )
    NgramChannel.cached(tmp_path, other_word, other)
    assert len(list(tmp_path.glob("ngram-channel-*.npz"))) == 2
    path.write_bytes(b"not an npz")
    with caplog.at_level("WARNING"):
        rebuilt = NgramChannel.cached(tmp_path, word, vocab)
    assert "unreadable" in caplog.text and (rebuilt.matrices[1] != channel.matrices[1]).nnz == 0


def test_the_item_wise_estimate_is_exact_for_text_composed_as_the_prior(setup):
    """yⱼ·πⱼ/(Aπ)ⱼ attributes each observed total to its own item by the prior's composition: perturbed totals of
    clean totals proportional to the prior give those clean totals back, in every order."""
    vocab, _, channel, _, _ = setup
    for n in (1, 2, 3):
        sel = vocab.orders == n
        prior = vocab.alpha[sel] / vocab.alpha[sel].sum()
        A = channel.order(n, vocab)
        clean = 5000.0 * prior
        kept = np.asarray(A @ prior) > 0
        np.testing.assert_allclose(item_estimate(A @ clean, A, prior)[kept], clean[kept], rtol=1e-9)


def test_the_em_starts_where_the_noisy_totals_are_fitted_better_and_the_error_bars_hold_it(setup):
    """Each order's EM starts at whichever of the prior and the item-wise estimate fits the noisy totals better (here,
    3× the users' reports at ε = 1: the item-wise estimate, in every order); the bootstrap reruns it from the same
    start: at the release's own noisy totals it gives the released pseudo-counts again (from the prior, it would
    not)."""
    vocab, _, channel, _, reports = setup
    p = PosteriorParams(1.0, 1e-6, discovery=False)
    totals = _totals(reports, vocab)
    totals.public *= 3
    r = posterior_release(totals, vocab, p, np.random.default_rng(12), channel=channel)
    assert {fit.start for fit in r.fits.values()} == {"items"}, {n: f.start for n, f in r.fits.items()}
    for n, fit in r.fits.items():
        sel = vocab.orders == n
        y, A, prior = r.noisy_public[sel], channel.order(n, vocab), vocab.alpha[sel] / vocab.alpha[sel].sum()
        target = deconvolution_target(fit.eb, y, p.sigma)
        fits = {
            start: deconvolve(
                y, A, prior, p.sigma, fit_to=target, starts=(start,), occurrence_weight=p.occurrence_weight
            )
            for start in ("prior", "items")
        }
        assert fits["items"].start_discrepancy < fits["prior"].start_discrepancy, n
        assert fits["items"].iterations == fit.steps
    again = held_post_process(r.noisy_public[None], [], np.empty((1, 0)), r.fits, vocab, r.sigma, r.threshold, channel)
    np.testing.assert_allclose(again[0], r.pseudo_counts, rtol=1e-9)
    from_prior = {n: dataclasses.replace(f, start="prior") for n, f in r.fits.items()}
    wrong = held_post_process(
        r.noisy_public[None], [], np.empty((1, 0)), from_prior, vocab, r.sigma, r.threshold, channel
    )
    assert not np.allclose(wrong[0], r.pseudo_counts, rtol=1e-3)


def _false_alarms_within(hits: int, trials: int, rate: float, alpha: float = 1e-3) -> bool:
    """Whether ``hits`` in ``trials`` is consistent with a chance of at most ``rate`` each (one-sided binomial test
    at false-alarm rate ``alpha``)."""
    return bool(stats.binom.sf(hits - 1, trials, rate) > alpha)


def test_items_stand_out_of_the_noise_with_the_stated_false_alarm_rate(setup):
    """Where every noisy total is the prior's prediction plus DP noise, some item of the order stands out in at most
    ``ITEM_FALSE_ALARM`` of the trials (binomial test, false-alarm rate 0.1%); the same audit rejects a gate without
    the Bonferroni correction (each item at that rate), and a real deviation stands out."""
    vocab, _, channel, _, _ = setup
    rng = np.random.default_rng(5)
    sigma, trials = 4.4, 2000
    for n in (2, 3):
        sel = vocab.orders == n
        A, prior = channel.order(n, vocab), vocab.alpha[sel] / vocab.alpha[sel].sum()
        mean = np.asarray(A @ (3000.0 * prior))
        obs = mean[:, None] + sigma * rng.standard_normal((mean.size, trials))
        hits = int(stands_out(obs, A, prior, sigma).any(axis=0).sum())
        assert _false_alarms_within(hits, trials, ITEM_FALSE_ALARM), (n, hits)
        per_item = stands_out(obs, A, prior, sigma, false_alarm=ITEM_FALSE_ALARM * mean.size)
        assert not _false_alarms_within(int(per_item.any(axis=0).sum()), trials, ITEM_FALSE_ALARM), n
        shifted = obs.copy()
        shifted[7] += 12 * sigma  # ~7σ beyond the threshold
        assert stands_out(shifted, A, prior, sigma)[7].all(), n


def _spiked(setup):
    """A release whose trigrams the channel rarely keeps intact (3× the users' reports at ε = 1) and, one at a time,
    a noise spike just under the threshold of ``stands_out`` on each of the 12 trigrams least often seen intact: the
    trigram, the spiked noisy totals, the empirical-Bayes prior fitted to them, the order's prior and channel."""
    vocab, _, channel, _, reports = setup
    p = PosteriorParams(1.0, 1e-6, discovery=False)
    totals = _totals(reports, vocab)
    totals.public *= 3
    r = posterior_release(totals, vocab, p, np.random.default_rng(12), channel=channel)
    sel = vocab.orders == 3
    noisy, A, alpha = r.noisy_public[sel], channel.order(3, vocab), vocab.alpha[sel]
    prior = alpha / alpha.sum()
    pushed = np.asarray(A @ prior)
    quiet = np.flatnonzero((pushed > 0) & ~stands_out(noisy, A, prior, p.sigma))
    z = float(stats.norm.isf(ITEM_FALSE_ALARM / (2 * noisy.size)))
    for j in quiet[np.argsort(-(prior[quiet] / pushed[quiet]))[:12]]:
        y = noisy.copy()
        y[j] = pushed[j] * y.sum() / pushed.sum() + (z - 0.5) * p.sigma
        assert not stands_out(y, A, prior, p.sigma)[j]
        yield j, y, eb_fit(y, y.sum() * pushed / pushed.sum(), p.sigma, p.bins), alpha, A, p


def test_an_items_own_weight_in_the_mixture_is_left_out_of_what_is_deconvolved(setup):
    """The empirical-Bayes mixture is fitted to the same totals, so a spike on an item the prior expects ~0 of gets
    weight of its own and its plain posterior mean believes it (≥ 100× its prior mean in most of the cases);
    ``deconvolution_target`` leaves that weight out (under 10×), and elsewhere stays within a few percent of the plain
    posterior (the orders' masses within 1%)."""
    believed = 0
    for j, y, eb, *_, p in _spiked(setup):
        mu = eb.prior_mean[j]
        believed += int(eb_means(eb, y, p.sigma)[j] > 100 * mu)
        assert deconvolution_target(eb, y, p.sigma)[j] < 10 * mu, j
    assert believed >= 6, believed
    vocab, _, channel, _, reports = setup
    p = PosteriorParams(1.0, 1e-6, discovery=False)
    r = posterior_release(_totals(reports, vocab), vocab, p, np.random.default_rng(3), channel=channel)
    for n, fit in r.fits.items():
        y = r.noisy_public[vocab.orders == n]
        plain, target = eb_means(fit.eb, y, p.sigma), deconvolution_target(fit.eb, y, p.sigma)
        np.testing.assert_allclose(target.sum(), plain.sum(), rtol=0.01)
        ys = np.stack([y, y + p.sigma])
        np.testing.assert_allclose(deconvolution_target(fit.eb, ys, p.sigma)[0], target, rtol=1e-12)


def test_a_noise_spike_on_a_rarely_seen_item_is_not_read_item_wise_into_the_top(setup):
    """The item-wise start divides an item's total by its keep rate, with none of the EM's early stop to hold it:
    read so, a believed spike on a trigram the channel rarely keeps is the order's top item (a demo showed such a
    trigram, one no user wrote, at the top of its list). The clean estimate reads only items that stand out and
    leaves the item's own weight out of its posterior: each spiked item stays within 3× its prior share."""
    topped = 0
    for j, y, eb, alpha, A, p in _spiked(setup):
        prior = alpha / alpha.sum()
        as_is = item_estimate(eb_means(eb, y, p.sigma), A, prior)
        topped += int(np.argmax(as_is) == j)  # the failure the gate prevents
        clean = clean_estimate(y, alpha, p.sigma, p.bins, A, p.occurrence_weight)
        assert clean[j] / clean.sum() < 3 * prior[j], (j, clean[j] / clean.sum(), prior[j])
    assert topped >= 6, topped
