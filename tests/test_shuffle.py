"""The shuffler's permutation is uniform (chi-square over positions)."""

import numpy as np
from scipy import stats

from lac.shuffler.shuffle import secure_shuffle


def test_every_item_lands_in_every_position_uniformly():
    # n items, T shuffles: counts[item, position] ~ T/n each. Chi-square with (n-1)^2 dof;
    # false-alarm rate 1e-4 per run.
    n, trials = 6, 12_000
    counts = np.zeros((n, n), dtype=int)
    for _ in range(trials):
        items = list(range(n))
        secure_shuffle(items)
        counts[items, np.arange(n)] += 1
    chi2 = ((counts - trials / n) ** 2 / (trials / n)).sum()
    assert stats.chi2.sf(chi2, (n - 1) ** 2) > 1e-4
