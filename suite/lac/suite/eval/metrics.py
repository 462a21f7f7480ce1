"""KL divergence, smoothing, Clopper–Pearson intervals and the empirical ε lower bound."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta


def smooth(q: np.ndarray, lam: float) -> np.ndarray:
    """(1 − λ)·q + λ/V: a zero in a released q would make KL and perplexity infinite."""
    q = np.asarray(q, dtype=np.float64)
    return (1.0 - lam) * q + lam / q.size


def kl(p: np.ndarray, q: np.ndarray, lam: float) -> float:
    """KL(p ‖ smooth(q)) in nats."""
    qs = smooth(q, lam)
    nz = p > 0
    return float(np.sum(p[nz] * (np.log(p[nz]) - np.log(qs[nz]))))


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two one-sided Clopper–Pearson bounds (lower, upper), each at level ``confidence``."""
    a = 1.0 - confidence
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(successes: int, n: int, delta: float, confidence: float) -> float:
    """ε lower bound from n rounds of a paired guessing game (see ``membership``).

    Each round the adversary sees one release of D and one of D' in random order and names the
    one from D. The pair is (2ε, 2δ)-DP (composition over the two releases), and the
    adversary's guessing rule is symmetric, so its false-positive rate is 1 − p for success
    probability p: p ≤ e^{2ε}(1 − p) + 2δ, i.e. ε ≥ ½·log((p − 2δ)/(1 − p)). p is replaced by
    its one-sided Clopper–Pearson lower bound, so the bound holds with probability ≥ ``confidence``.
    """
    p_lo, _ = clopper_pearson(successes, n, confidence)
    if p_lo - 2.0 * delta <= 1.0 - p_lo:
        return 0.0
    return 0.5 * math.log((p_lo - 2.0 * delta) / (1.0 - p_lo))


def summarize(values) -> dict:
    """Median and min/max of repeated runs."""
    v = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
            "mean": float(v.mean()), "runs": int(v.size)}
