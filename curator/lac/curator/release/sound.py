"""A sound, data-independent ℓ2 sensitivity bound for BayesianDP, and the caps it relies on.

The released mean is μ_ps = ρ·r + (1−ρ)·μ_p with r = w ⊙ x̂, x̂ = ℓ − mean(ℓ)·1,
ℓ = log(1 + min(c, M)), w = min(1, S·N/C). ``sound_gamma`` bounds γ = ‖r(D) − r(D')‖₂ over
EVERY pair of data sets D, D' that differ by one user's whole contribution, from public
parameters only:

* m      reports one user can contribute (the privacy unit: k reports per accounting window ×
         the windows a release covers),
* W      at most W distinct items per report (``cap_rows``, applied by the mechanism itself),
* C      per-report, per-item clamp (a report contributes at most C to any item),
* M      item totals are clipped at M before the log (``count_clip``), so ℓ ∈ [0, log(1+M)]
         whatever the number of users: no public cap on the number of users is needed,
* V      vocabulary size (public, fixed before seeing the data), and S the decay slope.

Derivation. Let D be the smaller data set (totals c, report counts N) and D' = D + the user's
reports, holding the item set J (|J| ≤ K := min(m·W, V)) with total clamped counts
d_j ∈ [1, m·C] and adding at most m to each N_j. Then

  a_j := ℓ'_j − ℓ_j ∈ [0, A],  A := log(1 + m·C)   (j ∈ J; log(1+min(c+d,M)) − log(1+min(c,M))
        ≤ log((1+c+d)/(1+c)) ≤ log(1+d) for c ≥ 0),   a_i := 0 (i ∉ J),   x̂' = x̂ + (a − ā·1).

For every item i,  r'_i − r_i = (w'_i − w_i)·x̂_i + w'_i·(a_i − ā).

(1) Weight term. w'_i = w_i off J; on J, 0 ≤ w'_j − w_j ≤ β := min(1, m·S/C) (w is
    1-Lipschitz in S·N/C, clipped at 1). Since 0 ≤ ℓ_i ≤ L := log(1 + M),
    |x̂_j| = |(1 − 1/V)·ℓ_j − Σ_{i≠j} ℓ_i/V| ≤ X := (1 − 1/V)·L. Hence ‖(w' − w) ⊙ x̂‖₂ ≤ β·X·√K.
(2) Count term. 0 ≤ w'_i ≤ 1, so ‖w' ⊙ (a − ā·1)‖₂ ≤ ‖a − ā·1‖₂, and
    ‖a − ā·1‖₂² = Σ a_i² − (Σ a_i)²/V is convex in a, so over the box a_J ∈ [0, A]^|J| it is
    maximised at a vertex with k coordinates equal to A: k·A²·(1 − k/V) ≤ A²·max_{k≤K} k(1 − k/V).

Triangle inequality: γ ≤ γ_sound := β·X·√K + A·sqrt(max_{0≤k≤K} k(1 − k/V)).

The bound holds for any data (caps are enforced by the mechanism, not assumed) and both
directions of adjacency. It does not depend on the data, so calibrating the Gaussian noise to
ρ·γ_sound gives (ε, δ)-DP for one user's whole contribution under add/remove adjacency.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
import scipy.sparse as sp

from lac.common.checks import check_int

__all__ = ["sound_gamma", "cap_rows", "SOUND_STATEMENT"]

SOUND_STATEMENT = "sound: data-independent worst case"


def sound_caps(W: int | None, count_clip: int | None) -> tuple[int, int]:
    """(W, count_clip), both needed by the sound sensitivity; ValueError if either is unset."""
    if W is None or count_clip is None:
        raise ValueError("sensitivity='sound' needs the public caps W and count_clip")
    return W, count_clip


def sound_gamma(S: float, C: int, W: int, V: int, count_clip: int, reports_per_user: int = 1) -> float:
    """γ_sound = β·(1−1/V)·log(1+M)·√K + log(1+m·C)·sqrt(max_{k≤K} k(1−k/V)), β = min(1, m·S/C), K = min(m·W, V).

    A worst-case bound on ‖w⊙x̂ − w'⊙x̂'‖₂ over all neighbours differing by one user's m
    reports (derivation in the module docstring).
    """
    if isinstance(S, bool) or not (isinstance(S, Real) and math.isfinite(S) and S > 0):
        raise ValueError(f"S must be finite and > 0, got {S!r}")
    C, W, V = check_int(C, "C"), check_int(W, "W"), check_int(V, "V")
    M, m = check_int(count_clip, "count_clip"), check_int(reports_per_user, "reports_per_user")
    beta = min(1.0, m * float(S) / C)
    K = min(m * W, V)
    X = (1.0 - 1.0 / V) * math.log1p(M)
    weight_term = beta * X * math.sqrt(K)
    k_star = min(K, max(0, V // 2))  # k(1−k/V) increases up to V/2
    best = max(k * (1.0 - k / V) for k in {k_star, min(K, k_star + 1), K})
    count_term = math.log1p(m * C) * math.sqrt(best)
    # Round up (relative 1e-12) so floating-point evaluation never lands below the real bound.
    return (weight_term + count_term) * (1.0 + 1e-12)


def cap_rows(U: sp.spmatrix | sp.sparray, W: int) -> sp.csr_matrix:
    """U with each row cut to its first W stored entries (a rule that looks at that row alone).

    The curator's counts already keep each report's first W items in reading order (so this is
    the identity there); the mechanisms apply it anyway so their caps hold by construction.
    """
    W = check_int(W, "W")
    U = sp.csr_matrix(U)
    U.sum_duplicates()
    U.eliminate_zeros()
    lens = np.diff(U.indptr)
    if lens.size == 0 or lens.max() <= W:
        return U
    rank = np.arange(U.indices.size) - np.repeat(U.indptr[:-1], lens)
    keep = rank < W
    indptr = np.zeros(U.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.minimum(lens, W), out=indptr[1:])
    return sp.csr_matrix((U.data[keep], U.indices[keep], indptr), shape=U.shape)
