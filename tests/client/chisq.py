"""Chi-square goodness of fit for sampled vocabulary outputs (shared by the mechanism tests)."""

import numpy as np
from scipy import stats


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of observed ``counts`` against ``probs``; cells expecting < 5 are pooled into one."""
    exp = probs * counts.sum()
    order = np.argsort(-exp)
    exp, counts = exp[order], counts[order]
    big = exp >= 5
    e = np.append(exp[big], exp[~big].sum())
    o = np.append(counts[big], counts[~big].sum())
    if e[-1] == 0:
        assert o[-1] == 0
        e, o = e[:-1], o[:-1]
    assert len(e) >= 10, "test is too coarse"
    return float(stats.chisquare(o, e).pvalue)
