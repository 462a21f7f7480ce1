"""Baselines of Ramadan et al. §4.2 and §4.5: Laplace, Laplace with public data, k-anonymity.

All take per-user counts U (rows = users, columns = the public vocabulary), clamp each count at
C (as BayesianDP does) and return a frozen result with ``probs`` (a probability vector over the
vocabulary), the parameters and a privacy statement.

* ``laplace_dp``: c + Lap(b) per item, threshold at 0, normalise. A report holds at most W items
  (cut by the mechanism, ``cap_rows``) with clamped counts ≤ C and a user sends at most m
  reports, so the ℓ1 sensitivity of c under add/remove-one-user is Δ₁ = m·W·C and b = m·W·C/ε
  gives ε-DP (the paper's b = W/ε with W counts per user overall is the same bound with C folded
  into W). Thresholding/normalising is post-processing.
* ``laplace_public_dp``: the paper's modified mechanism
  max[Σ_n w_n(Δc̃ⁿ − α̃) + e + α̃, 0], w_n = ‖Δcⁿ‖₁/‖c‖₁, renormalised. Since Σ_n w_n Δc̃ⁿ = c/‖c‖₁
  and Σ_n w_n = 1, f = c/‖c‖₁ − α̃. Adding/removing a user with t = ‖Δc‖₁ ≤ W·C changes c/‖c‖₁ by
  exactly 2t/T in ℓ1 (T = the larger total), so Δ₁ ≤ 2 for any data ("sound", the default) and
  Δ₁ ≤ min(2, 2·m·W·C/T_obs) at the observed total T_obs ("observed": data-dependent, NOT
  differentially private). The paper leaves Δf₁ unspecified.
* ``k_anonymity``: keep the totals of items held by ≥ K users, zero the rest, normalise.
  NOT differentially private (deterministic; the threshold uses exact counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lac.common.checks import check_int
from lac.common.privacy import Adjacency, Guarantee, GuaranteedResult, Model, PrivacyUnit, check_epsilon
from lac.common.rng import RandomSource, secure_generator
from lac.curator.release.bayesian import CountStats, count_stats
from lac.curator.release.sound import cap_rows

__all__ = [
    "BaselineRelease",
    "laplace_dp",
    "laplace_from_stats",
    "laplace_public_dp",
    "laplace_public_from_stats",
    "k_anonymity",
]


@dataclass(frozen=True, eq=False)
class BaselineRelease(GuaranteedResult):
    """A baseline release (Laplace, Laplace over public counts, or k-anonymity) with its guarantee, if any."""

    probs: np.ndarray  # released probability vector over the vocabulary
    mechanism: str  # "laplace" | "laplace-public" | "kanon"
    params: dict
    sensitivity: float  # ℓ1 sensitivity used (0 for k-anonymity)
    scale: float  # Laplace scale b (0 for k-anonymity)
    sensitivity_method: str
    epsilon: float  # inf for k-anonymity
    delta: float
    n_users: int
    vocab_size: int
    guarantee: Guarantee | None  # None: k-anonymity, which has no privacy guarantee
    mean: np.ndarray  # pre-noise vector (library/testing only, NOT private; never leaves the curator)
    noisy: np.ndarray | None = None  # DP vector before thresholding (as private as probs); None for kanon
    note: str = ""  # the statement of a release without a guarantee

    @property
    def data_dependent(self) -> bool:
        """True for k-anonymity and data-dependent calibrations: no DP guarantee."""
        return self.guarantee is None or self.guarantee.data_dependent


def _normalise(v: np.ndarray) -> np.ndarray:
    v = np.maximum(v, 0.0)
    s = v.sum()
    out = v / s if s > 0 else np.full(v.size, 1.0 / v.size)
    out.setflags(write=False)
    return out


def laplace_dp(
    U,
    W: int,
    C: int = 1,
    epsilon: float = 1.0,
    rng: RandomSource | None = None,
    unit: PrivacyUnit = PrivacyUnit.report(),
) -> BaselineRelease:
    """Standard Laplace baseline (§4.2 item 1): ε-DP with b = m·W·C/ε (see module docstring)."""
    return laplace_from_stats(count_stats(cap_rows(U, W), C), W, C, epsilon, rng, unit)


def laplace_from_stats(
    stats: CountStats,
    W: int,
    C: int = 1,
    epsilon: float = 1.0,
    rng: RandomSource | None = None,
    unit: PrivacyUnit = PrivacyUnit.report(),
) -> BaselineRelease:
    """``laplace_dp`` on the column totals of the W-capped rows (what a streaming engine computes)."""
    eps = check_epsilon(epsilon)
    V = stats.c.size
    if V == 0:
        raise ValueError("the vocabulary is empty")
    m = unit.max_reports
    sens = float(m * W * C)
    b = sens / eps
    rng = secure_generator() if rng is None else rng
    noisy = stats.c + rng.laplace(0.0, b, size=V)
    noisy.setflags(write=False)
    mean = stats.c.copy()
    mean.setflags(write=False)
    return BaselineRelease(
        probs=_normalise(noisy),
        mechanism="laplace",
        params=dict(W=int(W), C=int(C), epsilon=eps),
        sensitivity=sens,
        scale=b,
        sensitivity_method="sound",
        epsilon=eps,
        delta=0.0,
        n_users=stats.n_users,
        vocab_size=V,
        guarantee=Guarantee(
            Model.CENTRAL,
            eps,
            0.0,
            unit,
            Adjacency.ADD_REMOVE,
            "Laplace baseline (Ramadan et al. §4.2)",
            details=(
                f"ℓ1 sensitivity m·W·C = {sens:g} (≤ W={W} items per report, counts clamped at "
                f"C={C}, {m} report(s) per user; data-independent worst case), Laplace scale "
                f"b = {b:.6g} per item; thresholded at 0 and normalised (post-processing).",
            ),
        ),
        mean=mean,
        noisy=noisy,
    )


def laplace_public_dp(
    U,
    alpha: np.ndarray,
    W: int,
    C: int = 1,
    epsilon: float = 1.0,
    sensitivity: str = "sound",
    rng: RandomSource | None = None,
    unit: PrivacyUnit = PrivacyUnit.report(),
) -> BaselineRelease:
    """Laplace with public data (§4.2 item 2); ``sensitivity`` "sound" (Δ₁ = 2) or "observed"."""
    if U.shape[1] != np.asarray(alpha).size:
        raise ValueError(f"U has {U.shape[1]} columns but alpha has {np.asarray(alpha).size} entries")
    return laplace_public_from_stats(count_stats(cap_rows(U, W), C), alpha, W, C, epsilon, sensitivity, rng, unit)


def laplace_public_from_stats(
    stats: CountStats,
    alpha: np.ndarray,
    W: int,
    C: int = 1,
    epsilon: float = 1.0,
    sensitivity: str = "sound",
    rng: RandomSource | None = None,
    unit: PrivacyUnit = PrivacyUnit.report(),
) -> BaselineRelease:
    """``laplace_public_dp`` on the column totals of the W-capped rows."""
    eps = check_epsilon(epsilon)
    if sensitivity not in ("sound", "observed"):
        raise ValueError(f"sensitivity must be 'sound' or 'observed', got {sensitivity!r}")
    alpha = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if stats.c.size != alpha.size or alpha.size == 0:
        raise ValueError(f"the counts cover {stats.c.size} items but alpha has {alpha.size} entries")
    if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or alpha.sum() <= 0:
        raise ValueError("alpha must be finite, >= 0 and not all zero")
    m = unit.max_reports
    T = float(stats.c.sum())
    a = alpha / alpha.sum()
    f = (stats.c / T if T > 0 else np.zeros_like(a)) - a
    if sensitivity == "sound":
        sens = 2.0
    else:
        sens = min(2.0, 2.0 * m * W * C / T) if T > 0 else 2.0
    b = sens / eps
    rng = secure_generator() if rng is None else rng
    noisy = f + rng.laplace(0.0, b, size=a.size) + a
    noisy.setflags(write=False)
    mean = f + a
    mean.setflags(write=False)
    how = (
        "sound: data-independent worst case (two probability vectors differ by ≤ 2 in ℓ1)"
        if sensitivity == "sound"
        else f"data-dependent: 2·m·W·C/‖c‖₁ at the observed total ‖c‖₁ = {T:g}, so the noise scale "
        f"itself depends on the data"
    )
    return BaselineRelease(
        probs=_normalise(noisy),
        mechanism="laplace-public",
        params=dict(W=int(W), C=int(C), epsilon=eps, sensitivity=sensitivity),
        sensitivity=sens,
        scale=b,
        sensitivity_method=sensitivity,
        epsilon=eps,
        delta=0.0,
        n_users=stats.n_users,
        vocab_size=int(a.size),
        guarantee=Guarantee(
            Model.CENTRAL,
            eps,
            0.0,
            unit,
            Adjacency.ADD_REMOVE,
            "Laplace with public data (Ramadan et al. §4.2)",
            data_dependent=sensitivity != "sound",
            details=(
                f"Laplace noise on f = c/‖c‖₁ − α̃ with ℓ1 sensitivity {sens:.6g} ({how}), "
                f"scale b = {b:.6g}; + α̃, thresholded at 0 and renormalised (post-processing).",
            ),
        ),
        mean=mean,
        noisy=noisy,
    )


def k_anonymity(U, K: int, C: int = 1) -> BaselineRelease:
    """k-anonymity baseline (§4.5): totals of items held by ≥ K users, normalised. NOT DP."""
    check_int(K, "K")
    stats = count_stats(U, C)
    if stats.c.size == 0:
        raise ValueError("the vocabulary is empty")
    kept = np.where(stats.N >= K, stats.c, 0.0)
    mean = stats.c.copy()
    mean.setflags(write=False)
    return BaselineRelease(
        probs=_normalise(kept),
        mechanism="kanon",
        params=dict(K=int(K), C=int(C)),
        sensitivity=0.0,
        scale=0.0,
        sensitivity_method="none",
        epsilon=math.inf,
        delta=0.0,
        n_users=stats.n_users,
        vocab_size=int(stats.c.size),
        guarantee=None,
        note=(
            f"NOT differentially private: k-anonymity baseline (K={K}): items held by fewer than K users are "
            f"suppressed, the others are released with exact clamped counts (C={C}), normalised. It is "
            f"deterministic and offers no protection against linkage or differencing attacks."
        ),
        mean=mean,
    )
