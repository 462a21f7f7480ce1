"""A sound, data-independent ℓ2 sensitivity bound for BayesianDP.

The released mean is μ_ps = ρ·r + (1−ρ)·μ_p with r = w ⊙ x̂,
x̂ = ℓ − mean(ℓ)·1, ℓ = log(c+1), w = min(1, S·N/C). ``sound_gamma`` bounds
γ = ‖r(D) − r(D')‖₂ over EVERY pair of data sets D, D' that differ by adding/removing one user,
using public parameters only:

* C      per-item clamp (each user contributes at most C to any item),
* W      at most W distinct items per user (enforced by the client / shuffler quota),
* V      vocabulary size |V| (public, fixed before seeing the data),
* n_max  public cap on the number of users in a release (both D and D' have ≤ n_max users),
* S      decay slope.

Derivation. Let D be the smaller data set (totals c, N) and D' = D + one user u holding the item
set J (|J| ≤ W) with clamped counts d_j ∈ [1, C]. Then c' = c + d on J, N' = N + 1_J, and

  a_j := ℓ'_j − ℓ_j = log((1 + c_j + d_j)/(1 + c_j)) ∈ (0, A],  A := log(1 + C)   (j ∈ J),
  a_i := 0 (i ∉ J),   ā := mean(a),   x̂' = x̂ + (a − ā·1).

For every item i,  r'_i − r_i = w'_i x̂'_i − w_i x̂_i = (w'_i − w_i)·x̂_i + w'_i·(a_i − ā).
Note the mean shift ā touches ALL V items (through a_i − ā = −ā for i ∉ J), weighted by w'_i.

(1) Weight term. w'_i = w_i off J; on J, 0 ≤ w'_j − w_j ≤ β := min(1, S/C) (w is 1-Lipschitz
    in S·N/C clipped at 1). D has at most n_max − 1 users, so 0 ≤ ℓ_i ≤ L := log(1 + (n_max−1)·C)
    and x̂_j = (1 − 1/V)·ℓ_j − Σ_{i≠j} ℓ_i/V ∈ [−(1−1/V)·L, (1−1/V)·L], i.e. |x̂_j| ≤ X := (1−1/V)·L.
    Hence ‖(w' − w) ⊙ x̂‖₂ ≤ β·X·√W.
    (x̂ can be as large as log(n_max·C+1) in magnitude, which is why the weight change — not the
    count change — dominates the bound when S·N/C < 1 is possible.)

(2) Count term. 0 ≤ w'_i ≤ 1, so |w'_i (a_i − ā)| ≤ |a_i − ā| for every i, and
    ‖w' ⊙ (a − ā·1)‖₂ ≤ ‖a − ā·1‖₂. Centering is an orthogonal projection:
    ‖a − ā·1‖₂² = Σ a_i² − (Σ a_i)²/V. This is convex in a, so over the box a_J ∈ [0, A]^|J| it is
    maximised at a vertex with k coordinates equal to A: k·A²·(1 − k/V). Hence
    ‖a − ā·1‖₂ ≤ A·sqrt(max_{0≤k≤min(W,V)} k(1 − k/V)).

Triangle inequality:  γ ≤ γ_sound := β·X·√W + A·sqrt(max_k k(1 − k/V)).

The bound holds for any data set satisfying the public caps (≤ n_max users, ≤ W items per user;
counts are clamped at C by the mechanism itself) and for both directions of adjacency (the
norm is symmetric). With V = 1 it is 0, as it should be (x̂ ≡ 0). It does not depend on the data,
so calibrating the Gaussian noise to ρ·γ_sound gives (ε, δ)-DP under add/remove-one-user
adjacency without the caveats of the data-dependent brute-force / Claim 1 values.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp

__all__ = ["sound_gamma", "check_public_caps", "SOUND_STATEMENT"]

SOUND_STATEMENT = "sound: data-independent worst case"


def _pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def sound_gamma(S: float, C: int, W: int, V: int, n_max: int) -> float:
    """γ_sound = min(1,S/C)·(1−1/V)·log(1+(n_max−1)C)·√W + log(1+C)·sqrt(max_{k≤min(W,V)} k(1−k/V)).

    A worst-case bound on ‖w⊙x̂ − w'⊙x̂'‖₂ over all add/remove-one-user neighbours with at most
    n_max users and W items per user (derivation in the module docstring).
    """
    if isinstance(S, bool) or not (isinstance(S, Real) and math.isfinite(S) and S > 0):
        raise ValueError(f"S must be finite and > 0, got {S!r}")
    C, W, V, n_max = _pos_int("C", C), _pos_int("W", W), _pos_int("V", V), _pos_int("n_max", n_max)
    beta = min(1.0, float(S) / C)
    X = (1.0 - 1.0 / V) * math.log1p((n_max - 1) * C)
    weight_term = beta * X * math.sqrt(W)
    kmax = min(W, V)
    k_star = min(kmax, max(0, V // 2))  # k(1−k/V) increases up to V/2
    best = 0.0
    for k in {k_star, min(kmax, k_star + 1), kmax}:
        best = max(best, k * (1.0 - k / V))
    count_term = math.log1p(C) * math.sqrt(best)
    # Round up (relative 1e-12) so floating-point evaluation never lands below the real bound.
    return (weight_term + count_term) * (1.0 + 1e-12)


def check_public_caps(U: sp.spmatrix | sp.sparray, W: int, n_max: int) -> None:
    """Raise ValueError unless U has ≤ n_max rows and every row holds ≤ W distinct items.

    The sound bound is only valid for inputs that respect the public caps; a data set that
    violates them is rejected (callers should enforce the caps upstream, e.g. the client's W
    and the shuffler's quota, so that this never fires in production).
    """
    W, n_max = _pos_int("W", W), _pos_int("n_max", n_max)
    if not sp.issparse(U):
        raise TypeError(f"expected a scipy.sparse matrix, got {type(U).__name__}")
    U = U.tocsr()
    if U.shape[0] > n_max:
        raise ValueError(f"{U.shape[0]} users exceed the public cap n_max={n_max}")
    if U.shape[0]:
        V = U.copy()
        V.sum_duplicates()
        V.eliminate_zeros()
        per_row = np.diff(V.indptr)
        if per_row.max() > W:
            raise ValueError(f"a user holds {int(per_row.max())} items, above the public cap W={W}")
