"""KL divergence, smoothing, Clopper–Pearson intervals, the empirical ε lower bound and the audit verdict."""

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
    if successes == n:
        return max_certifiable_epsilon(n, delta, confidence)
    p_lo, _ = clopper_pearson(successes, n, confidence)
    if p_lo - 2.0 * delta <= 1.0 - p_lo:
        return 0.0
    return 0.5 * math.log((p_lo - 2.0 * delta) / (1.0 - p_lo))


def max_certifiable_epsilon(n: int, delta: float, confidence: float) -> float:
    """The largest ε lower bound n rounds can give at all: the bound for an attack that wins every round.

    The one-sided Clopper–Pearson lower bound of n/n is (1 − confidence)^(1/n), so the ceiling
    grows only like ½·log(n / log(1/(1 − confidence))): a claim above it cannot be tested.
    """
    if n <= 0:
        return 0.0
    # Closed form of epsilon_lower_bound(n, n, ...), stable for any n (beta.ppf(a, n, 1) = a^(1/n)).
    r = math.log(1.0 - confidence) / n
    p_lo, miss = math.exp(r), -math.expm1(r)
    if p_lo - 2.0 * delta <= miss:
        return 0.0
    return 0.5 * math.log((p_lo - 2.0 * delta) / miss)


def trials_needed(epsilon: float, delta: float, confidence: float) -> int | float:
    """Smallest n with ``max_certifiable_epsilon(n, delta, confidence) > epsilon``.

    That is, the fewest rounds with which an attack winning every round would show, at
    ``confidence``, that a mechanism claiming ε is not (ε, δ)-DP. Returns an int, or ``math.inf``
    when the number is beyond floating point (ε ≳ 370).
    """
    if not (epsilon >= 0 and 0 <= delta < 0.5 and 0 < confidence < 1):
        raise ValueError(
            f"need epsilon >= 0, 0 <= delta < 0.5, 0 < confidence < 1; got {epsilon}, {delta}, {confidence}"
        )
    # Need p_lo = (1 − c)^(1/n) > p* = (e^{2ε} + 2δ)/(1 + e^{2ε}); q = 1 − p*, written with e^{−2ε} so it
    # neither overflows nor rounds to 0 while it is representable.
    t = math.exp(-2.0 * epsilon)
    q = (1.0 - 2.0 * delta) * t / (1.0 + t)
    if q <= 0.0:
        return math.inf
    x = math.log(1.0 / (1.0 - confidence)) / -math.log1p(-q)
    if x >= 2.0**1000:
        return math.inf
    n = math.floor(x) + 1
    if x > 2.0**40:  # beyond this, ±1 is below floating-point resolution
        return n
    # Settle the boundary in floating point, so that the two functions agree exactly.
    while max_certifiable_epsilon(n, delta, confidence) <= epsilon:
        n += 1
    while n > 1 and max_certifiable_epsilon(n - 1, delta, confidence) > epsilon:
        n -= 1
    return n


def audit_verdict(successes: int, n: int, claimed_epsilon: float, delta: float, confidence: float) -> dict:
    """Verdict of one paired-game audit of a claimed (ε, δ) (see ``epsilon_lower_bound``).

    * ``violated``: the ε lower bound exceeds the claim — the mechanism is not (ε, δ)-DP, with
      probability of a false alarm ≤ 1 − ``confidence`` (Clopper–Pearson is exact-or-conservative);
    * ``consistent``: not violated, and n rounds could have shown a violation (an attack winning
      every round would certify more than the claim). This is no proof of the claim: only this
      attack failed to break it;
    * ``inconclusive``: even a perfect attack could not certify the claimed ε with n rounds;
      ``trials_needed`` says how many rounds could.
    """
    lb = epsilon_lower_bound(successes, n, delta, confidence)
    ceiling = max_certifiable_epsilon(n, delta, confidence)
    if lb > claimed_epsilon:
        verdict = "violated"
    elif ceiling > claimed_epsilon:
        verdict = "consistent"
    else:
        verdict = "inconclusive"
    need = trials_needed(claimed_epsilon, delta, confidence)
    return {
        "eps_lower_bound": lb,
        "max_certifiable_eps": ceiling,
        "verdict": verdict,
        "trials_needed": None if math.isinf(need) else int(need),
        "confidence": confidence,
    }


def summarize(values) -> dict:
    """Median and min/max of repeated runs."""
    v = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(v)),
        "min": float(v.min()),
        "max": float(v.max()),
        "mean": float(v.mean()),
        "runs": int(v.size),
    }
