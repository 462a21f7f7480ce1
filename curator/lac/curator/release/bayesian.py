"""BayesianDP (Ramadan, Withers & Orr, "N-grams Bayesian Differential Privacy", Algorithm 1).

Notation (paper): per-user counts Δcⁿ clamped at C, totals c = Σₙ Δcⁿ, N_j = number of users
holding item j, V = vocabulary size,
  x̂ = log(c+1) − mean(log(c+1))                  (eq. 2; eq. 1 gives μ_p from public α)
  w = min(1, S·N/C)                               (eq. 5)
  μ_ps = ρ·(w ⊙ x̂) + (1−ρ)·μ_p                    (Corollary 1)
  h ~ N(μ_ps, σ² I),  θ = softmax(h)              (eq. 4)
γ is the ℓ2 sensitivity of w ⊙ x̂ to removing one user; μ_ps moves by ρ·γ, so σ is calibrated
for sensitivity ρ·γ. The "bruteforce" and "claim1" γ methods look at the observed data (see
``BayesianRelease``) and are NOT differentially private; "sound" (lac.curator.release.sound) is a
data-independent worst case from public parameters (C, S, W, |V|, the clip M on item totals and
the reports one user can contribute), and the mechanism enforces those caps itself.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from numbers import Real

import numpy as np
import scipy.sparse as sp

from lac.common.checks import check_int
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit, check_delta, check_epsilon
from lac.common.rng import RandomSource, secure_generator
from lac.curator.release.gaussian import METHODS as _CALIBRATIONS
from lac.curator.release.gaussian import calibrate
from lac.curator.release.sound import SOUND_STATEMENT, cap_rows, sound_caps, sound_gamma

__all__ = [
    "BayesianParams",
    "BayesianRelease",
    "CountStats",
    "prior_mean",
    "log_mean_center",
    "decay_weights",
    "count_stats",
    "bruteforce_sq_dists",
    "bruteforce_gamma",
    "claim1_gamma",
    "snap_grid",
    "bayesian_dp",
    "bayesian_from_stats",
]

SENSITIVITY_METHODS = ("bruteforce", "claim1", "sound")
LOG_THETA_GRID = 2.0**-40
_BLOCK_NNZ = 1 << 22  # rows are processed in blocks of about this many non-zeros (bounds memory)


def _check_S_C(S: float, C: int) -> None:
    if isinstance(S, bool) or not (isinstance(S, Real) and math.isfinite(S) and S > 0):
        raise ValueError(f"S must be finite and > 0, got {S!r}")
    check_int(C, "C")


@dataclass(frozen=True)
class BayesianParams:
    """Parameters of one BayesianDP release (defaults: C = 1 as in the paper for < 1M users).

    ``sensitivity="sound"`` needs the public caps ``W`` (items per report) and ``count_clip``
    (item totals are clipped there before the log); ``unit`` says how many reports one user
    contributes (the sound γ covers all of them). "bruteforce" and "claim1" are the paper's
    data-dependent methods: one user = one report, NOT differentially private.
    """

    epsilon: float
    delta: float
    S: float = 1.0
    C: int = 1
    rho: float = 0.9
    sensitivity: str = "sound"
    calibration: str = "auto"
    W: int | None = None
    count_clip: int | None = None
    unit: PrivacyUnit = PrivacyUnit.report()

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta, allow_zero=False)
        _check_S_C(self.S, self.C)
        if isinstance(self.rho, bool) or not (isinstance(self.rho, Real) and 0 < self.rho <= 1):
            raise ValueError(f"rho must be in (0, 1], got {self.rho!r}")
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise ValueError(f"sensitivity must be one of {SENSITIVITY_METHODS}, got {self.sensitivity!r}")
        for name in ("W", "count_clip"):
            v = getattr(self, name)
            if v is not None:
                check_int(v, f"{name} (or None)")
        if self.sensitivity == "sound":
            self.sound_caps()
        if self.calibration not in _CALIBRATIONS:
            raise ValueError(f"calibration must be one of {_CALIBRATIONS}, got {self.calibration!r}")
        if self.calibration == "classic" and self.epsilon >= 1:
            raise ValueError(
                f"classic Gaussian calibration is only valid for epsilon < 1 (got {self.epsilon}); "
                "use calibration='analytic' or 'auto'"
            )

    @property
    def data_dependent(self) -> bool:
        """True for the paper's data-dependent sensitivity methods (not DP); False for "sound"."""
        return self.sensitivity != "sound"

    def sound_caps(self) -> tuple[int, int]:
        """The public caps (W, count_clip) of the sound sensitivity (always set when it is "sound")."""
        return sound_caps(self.W, self.count_clip)


@dataclass(frozen=True, eq=False)
class BayesianRelease:
    """One BayesianDP output. Only ``log_theta`` (and the parameters) are meant to be published."""

    log_theta: np.ndarray  # log softmax of the snapped h, rounded to LOG_THETA_GRID
    mean: np.ndarray  # μ_ps before noise: library/testing only, NOT private; never leaves the curator
    gamma: float  # ℓ2 sensitivity of w ⊙ x̂ (μ_ps's is rho·gamma)
    sigma: float
    calibration: str  # method actually used ("classic" | "analytic")
    sensitivity_method: str
    n_users: int
    vocab_size: int
    params: BayesianParams
    guarantee: Guarantee
    grid: float = field(default=0.0)  # Λ, the grid h was snapped to (0 when sigma == 0)

    @property
    def data_dependent(self) -> bool:
        """True when the sensitivity was data-dependent: the release is not DP."""
        return self.guarantee.data_dependent

    @property
    def statement(self) -> str:
        """The release's guarantee in words."""
        return self.guarantee.statement()


def log_mean_center(counts_per_item: np.ndarray) -> np.ndarray:
    """log(c+1) − mean(log(c+1)) over all items (equation 2; equation 1 for public counts)."""
    c = np.asarray(counts_per_item, dtype=np.float64).reshape(-1)
    if c.size == 0:
        raise ValueError("need at least one item")
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("counts must be finite and >= 0")
    ell = np.log1p(c)
    return ell - ell.mean()


def prior_mean(alpha: np.ndarray) -> np.ndarray:
    """μ_p from public counts α (equation 1)."""
    return log_mean_center(alpha)


def decay_weights(N: np.ndarray, S: float, C: int) -> np.ndarray:
    """w = min(1, S·N/C) (equation 5); 0 for items nobody holds."""
    return np.minimum(1.0, S * np.asarray(N) / C)


@dataclass(frozen=True, eq=False)
class CountStats:
    """Column totals of clamped counts: the only global state the sensitivity map needs.

    Sums over disjoint row partitions add up (``a + b``), so a distributed engine can compute
    them per partition, combine, and then map ``bruteforce_sq_dists`` over partitions.
    """

    c: np.ndarray  # float64 totals c_j of counts clamped at C
    N: np.ndarray  # int64 number of users holding j
    n_users: int
    C: int

    def __add__(self, other: CountStats) -> CountStats:
        if self.C != other.C or self.c.shape != other.c.shape:
            raise ValueError("CountStats differ in C or vocabulary size")
        return CountStats(self.c + other.c, self.N + other.N, self.n_users + other.n_users, self.C)


def _csr_parts(U: sp.spmatrix | sp.sparray) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """(indptr, indices, data) of U with sorted, unique, strictly positive entries; no copy if
    U already is like that."""
    if not sp.issparse(U):
        raise TypeError(f"expected a scipy.sparse matrix, got {type(U).__name__}")
    if U.format != "csr":
        U = U.tocsr()
    data = U.data
    if data.dtype.kind not in "iuf":
        raise ValueError(f"counts must be numeric, got dtype {data.dtype}")
    if data.dtype.kind == "f" and (not np.all(np.isfinite(data)) or np.any(data != np.floor(data))):
        raise ValueError("counts must be non-negative integers")
    if data.size and data.min() < 0:
        raise ValueError("counts must be non-negative integers")
    if not U.has_canonical_format or (data.size and not data.all()):
        U = U.copy()
        U.sum_duplicates()
        U.eliminate_zeros()
    return U.indptr, U.indices, U.data, U.shape


def count_stats(U: sp.spmatrix | sp.sparray, C: int) -> CountStats:
    """c and N of the rows of U (counts clamped at C as in Algorithm 1)."""
    _check_S_C(1.0, C)
    _, indices, data, (n, V) = _csr_parts(U)
    c = np.zeros(V, dtype=np.float64)
    for a in range(0, indices.size, _BLOCK_NNZ):
        b = min(a + _BLOCK_NNZ, indices.size)
        c += np.bincount(indices[a:b], weights=np.minimum(data[a:b], C).astype(np.float64), minlength=V)
    N = np.bincount(indices, minlength=V).astype(np.int64)
    return CountStats(c, N, int(n), int(C))


def bruteforce_sq_dists(
    U: sp.spmatrix | sp.sparray, stats: CountStats, S: float, C: int, block_nnz: int = _BLOCK_NNZ
) -> np.ndarray:
    """‖w⊙x̂ − w₋ₙ⊙x̂₋ₙ‖₂² for every row n of U (U may be one partition of the data whose
    global totals are ``stats``), exactly, in O(nnz(U) + V).

    Removing user n lowers log(c+1) only on the user's items J_n, so mean(log(c+1)) drops by
    δ_n = Σ_{j∈J_n} [log(c_j+1) − log(c_j−Δc_j+1)]/V and every item outside J_n moves by
    −w_i·δ_n. The squared norm is δ_n²·(Σ_i w_i² − Σ_{J_n} w_j²) + Σ_{J_n} e_j² with
    e_j = (w_j − w₋ₙ,j)·x̂_j + w₋ₙ,j·(log((c_j+1)/(c_j−Δc_j+1)) − δ_n).
    """
    _check_S_C(S, C)
    if stats.C != C:
        raise ValueError(f"stats were computed with C={stats.C}, not {C}")
    indptr, indices, data, (n, V) = _csr_parts(U)
    if stats.c.size != V:
        raise ValueError(f"U has {V} columns but stats cover {stats.c.size} items")
    out = np.zeros(n, dtype=np.float64)
    if n == 0 or indices.size == 0:
        return out
    c, N = stats.c, stats.N
    w = decay_weights(N, S, C)
    ell = np.log1p(c)
    xhat = ell - ell.mean()
    w2_all = float(np.dot(w, w))
    indptr = np.asarray(indptr, dtype=np.int64)
    # Row blocks with about block_nnz non-zeros each.
    cuts = np.searchsorted(indptr, np.arange(0, indptr[-1], max(int(block_nnz), 1)), side="right") - 1
    cuts = np.unique(np.concatenate([[0], cuts, [n]]))
    for r0, r1 in itertools.pairwise(cuts):
        a, b = indptr[r0], indptr[r1]
        if a == b:
            continue
        j = indices[a:b]
        d = np.minimum(data[a:b], C).astype(np.float64)
        cj = c[j]
        if np.any(cj < d):
            raise ValueError("stats do not include these rows (a column total is below a row's count)")
        dl = np.log1p(d / (cj - d + 1.0))  # log(c_j+1) − log(c_j−Δc_j+1), accurate for small ratios
        lens = np.diff(indptr[r0 : r1 + 1])
        nz = np.flatnonzero(lens)
        starts = indptr[r0 + nz] - a
        delta = np.add.reduceat(dl, starts) / V
        Nj = N[j]
        wj = w[j]
        wm = np.minimum(1.0, S * (Nj - 1) / C)
        e = (wj - wm) * xhat[j] + wm * (dl - np.repeat(delta, lens[nz]))
        inside = np.add.reduceat(e * e, starts)
        w2_in = np.add.reduceat(wj * wj, starts)
        out[r0 + nz] = inside + delta * delta * np.maximum(w2_all - w2_in, 0.0)
    return out


def bruteforce_gamma(U: sp.spmatrix | sp.sparray, S: float, C: int) -> float:
    """Exact γ = max over present users n of ‖w⊙x̂ − w₋ₙ⊙x̂₋ₙ‖₂ (0 with no users).

    Data-dependent: it is the sensitivity at the observed data set for removing a present
    user, not a worst case over all data sets (as in the paper's brute-force method).
    """
    stats = count_stats(U, C)
    sq = bruteforce_sq_dists(U, stats, S, C)
    return float(math.sqrt(sq.max())) if sq.size else 0.0


def _claim1_from_stats(stats: CountStats, S: float, C: int) -> float:
    V = stats.c.size
    held = stats.N > 0
    if not held.any():
        return 0.0
    Nh = stats.N[held].astype(np.float64)
    inv = 1.0 / Nh
    L = (1.0 - 1.0 / V) * inv + (inv.sum() - inv) / V
    w = decay_weights(Nh, S, C)
    xhat = log_mean_center(stats.c)[held]
    term = w * L * C + (S / C) * np.abs(xhat) * (S * Nh / C <= 1.0)
    return float(np.linalg.norm(term))


def claim1_gamma(U: sp.spmatrix | sp.sparray, S: float, C: int) -> float:
    """Claim 1 of the paper: ‖w⊙L·C + (S/C)·|x̂|⊙1(N ≤ C/S)‖₂ with
    L_i = (1−1/V)/N_i + Σ_{j≠i} 1/(V·N_j), all sums over items some user holds (N > 0; for the
    others w = 0 and no removal changes them). V is the full vocabulary size.

    Data-dependent (uses the observed N and x̂). As stated it does NOT always dominate the
    exact value: the proof's term (w − w₋ₙ)⊙x̂ is non-zero also for C/S < N < C/S + 1, which
    the indicator 1(N ≤ C/S) misses when C/S is not an integer (tests show counterexamples);
    with C/S an integer it dominated the exact γ on every random input we tried.
    """
    _check_S_C(S, C)
    return _claim1_from_stats(count_stats(U, C), S, C)


def snap_grid(sigma: float) -> float:
    """Λ = smallest power of two >= σ·2⁻¹⁰ (0 for σ = 0)."""
    if sigma == 0:
        return 0.0
    x = sigma * 2.0**-10
    m, e = math.frexp(x)
    return x if m == 0.5 else math.ldexp(1.0, e)


_FLOAT_NOTE = (
    "Floating point: h is snapped to a grid of spacing Λ before the softmax (a mitigation in the spirit "
    "of Mironov 2012, not a proof)."
)


def _guarantee(p: BayesianParams, gamma: float, sigma: float, calibration: str, V: int) -> Guarantee:
    noise = (
        f"Gaussian mechanism on μ_ps = ρ·(w⊙x̂) + (1−ρ)·μ_p with ℓ2 sensitivity ρ·γ = {p.rho:g}·{gamma:.6g}, "
        f"σ = {sigma:.6g} ({calibration} calibration); per-report item counts clamped at C={p.C}, S={p.S:g}, "
        f"{V} items."
    )
    name = "BayesianDP (Ramadan et al., Algorithm 1)"
    if p.sensitivity == "sound":
        m = p.unit.max_reports
        return Guarantee(
            Model.CENTRAL,
            p.epsilon,
            p.delta,
            p.unit,
            Adjacency.ADD_REMOVE,
            name,
            details=(
                noise,
                f"γ is {SOUND_STATEMENT} over all data sets with at most W={p.W} items per report, item totals "
                f"clipped at M={p.count_clip} before the log and {m} report(s) per user (lac.curator.release.sound; "
                f"the mechanism enforces these caps itself).",
                _FLOAT_NOTE,
            ),
        )
    how = (
        "γ is the exact brute-force maximum over the reports present in this data set"
        if p.sensitivity == "bruteforce"
        else "γ is Claim 1 of Ramadan et al., evaluated on the observed N and x̂ (as stated it can under-estimate "
        "the exact value when C/S is not an integer)"
    )
    return Guarantee(
        Model.CENTRAL,
        p.epsilon,
        p.delta,
        PrivacyUnit.report(),
        Adjacency.ADD_REMOVE,
        name,
        data_dependent=True,
        details=(
            noise,
            f"{how}; it covers removing a present report, not adding an arbitrary one, and the "
            f"noise scale itself is a function of the data.",
            _FLOAT_NOTE,
        ),
    )


def bayesian_dp(
    U: sp.spmatrix | sp.sparray,
    alpha: np.ndarray,
    params: BayesianParams,
    rng: RandomSource | None = None,
) -> BayesianRelease:
    """Algorithm 1 (BayesianDP) on per-user counts U (rows = users, columns = vocabulary).

    Guarantee and caveats: see ``BayesianRelease.statement``. Noise comes from ``rng``
    (default: a fresh ``lac.common.rng`` CSPRNG generator). Floating-point mitigation: h is rounded to the grid
    Λ = ``snap_grid(σ)`` before the softmax, so the released low-order bits are those of a
    grid point rather than of μ_ps + noise; log θ is then rounded to multiples of 2⁻⁴⁰.
    """
    if not isinstance(params, BayesianParams):
        raise TypeError("params must be a BayesianParams")
    alpha = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if not sp.issparse(U):
        raise TypeError(f"expected a scipy.sparse matrix, got {type(U).__name__}")
    if U.shape[1] != alpha.size:
        raise ValueError(f"U has {U.shape[1]} columns but alpha has {alpha.size} entries")
    if params.sensitivity == "sound":
        U = cap_rows(U, params.sound_caps()[0])
    stats = count_stats(U, int(params.C))
    max_sq = None
    if params.sensitivity == "bruteforce":
        sq = bruteforce_sq_dists(U, stats, float(params.S), int(params.C))
        max_sq = float(sq.max()) if sq.size else 0.0
    return bayesian_from_stats(stats, alpha, params, rng, max_sq_dist=max_sq)


def bayesian_from_stats(
    stats: CountStats,
    alpha: np.ndarray,
    params: BayesianParams,
    rng: RandomSource | None = None,
    max_sq_dist: float | None = None,
) -> BayesianRelease:
    """``bayesian_dp`` from the column totals of the (for "sound": W-capped) rows, as a streaming
    engine computes them; ``max_sq_dist`` is the largest ``bruteforce_sq_dists`` over all rows,
    needed (only) for the brute-force sensitivity."""
    if not isinstance(params, BayesianParams):
        raise TypeError("params must be a BayesianParams")
    alpha = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if stats.c.size != alpha.size:
        raise ValueError(f"the counts cover {stats.c.size} items but alpha has {alpha.size} entries")
    if alpha.size == 0:
        raise ValueError("the vocabulary is empty")
    S, C, rho = float(params.S), int(params.C), float(params.rho)
    if stats.C != C:
        raise ValueError(f"stats were computed with C={stats.C}, not {C}")
    mu_p = prior_mean(alpha)
    w = decay_weights(stats.N, S, C)
    if params.sensitivity == "sound":
        W, M = params.sound_caps()
        xhat = log_mean_center(np.minimum(stats.c, M))
        gamma = sound_gamma(S, C, W, alpha.size, M, params.unit.max_reports)
    else:
        xhat = log_mean_center(stats.c)
        if params.sensitivity == "bruteforce":
            if max_sq_dist is None:
                raise ValueError("the brute-force sensitivity needs max_sq_dist")
            gamma = float(math.sqrt(max_sq_dist))
        else:
            gamma = _claim1_from_stats(stats, S, C)
    mean = rho * (w * xhat) + (1.0 - rho) * mu_p
    sigma, used = calibrate(rho * gamma, params.epsilon, params.delta, params.calibration)
    grid = snap_grid(sigma)
    if sigma > 0:
        rng = secure_generator() if rng is None else rng
        h = mean + sigma * rng.standard_normal(mean.size)
        h = np.rint(h / grid) * grid
    else:
        h = mean.copy()
    top = h.max()
    log_theta = h - (top + math.log(np.exp(h - top).sum()))
    log_theta = np.rint(log_theta / LOG_THETA_GRID) * LOG_THETA_GRID
    log_theta.setflags(write=False)
    mean.setflags(write=False)
    return BayesianRelease(
        log_theta=log_theta,
        mean=mean,
        gamma=gamma,
        sigma=float(sigma),
        calibration=used,
        sensitivity_method=params.sensitivity,
        n_users=stats.n_users,
        vocab_size=int(alpha.size),
        params=params,
        guarantee=_guarantee(params, gamma, sigma, used, int(alpha.size)),
        grid=grid,
    )
