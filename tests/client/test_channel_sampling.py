"""The local channel (``lac.client.channel``): Monte-Carlo output counts of the real mechanism.

Statistical checks compare the channel with the Localizer's own outputs (two-sample chi-square
homogeneity test, false-alarm rate 1e-3 per test), and show the same check failing for a channel
sampled at another ε.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lac.client.channel import sample_channel
from lac.client.localizer import OOV, Localizer
from lac.client.mechanisms import MultivariateLaplace

ALPHA = 1e-3


def _homogeneity_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample chi-square test that count vectors ``a`` and ``b`` (same cells) come from one distribution;
    cells expecting fewer than 5 in either sample are pooled."""
    tot = a + b
    keep = tot * min(a.sum(), b.sum()) / tot.sum() >= 5
    table = np.array([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    table = table[:, table.sum(axis=0) > 0]
    return float(stats.chi2_contingency(table, correction=False).pvalue)


def test_rows_count_every_draw_and_oov_is_the_centroid(glove200):
    rng = np.random.default_rng(1)
    c = sample_channel(glove200, MultivariateLaplace(8.0), [0, 5, OOV], draws=50, rng=rng)
    assert c.draws.tolist() == [50, 50, 50] and c.indptr.tolist()[0] == 0 and c.indptr.size == 4
    for i in range(3):
        assert c.counts[c.indptr[i] : c.indptr[i + 1]].sum() == 50
    assert c.cols.min() >= 0 and c.cols.max() < glove200.size
    with pytest.raises(ValueError, match="draws"):
        sample_channel(glove200, MultivariateLaplace(8.0), [0], draws=0)
    with pytest.raises(ValueError, match="rows"):
        sample_channel(glove200, MultivariateLaplace(8.0), [glove200.size], draws=1)


def test_the_channel_is_the_localizers_output_distribution_and_the_test_can_fail(glove10k):
    """For a frequent, a mid and a rare word: the channel's counts and the Localizer's outputs of the
    same word pass the homogeneity test; a channel sampled at ε = 6 instead of 8 fails it."""
    rng = np.random.default_rng(2)
    draws = 4000
    loc = Localizer(glove10k, MultivariateLaplace(8.0), rng=rng, calibrated=True)
    for row in (3, 400, 6000):
        word = glove10k.words[row]
        outputs = loc.privatize_many([word] * draws)
        seen = np.bincount([glove10k.index[r.sentences[0][0]] for r in outputs], minlength=glove10k.size)
        for eps, should_pass in ((8.0, True), (6.0, False)):
            c = sample_channel(glove10k, MultivariateLaplace(eps), [row], draws, rng)
            counts = np.bincount(c.cols, weights=c.counts, minlength=glove10k.size)
            p = _homogeneity_pvalue(seen, counts)
            assert (p > ALPHA) == should_pass, (word, eps, p)
