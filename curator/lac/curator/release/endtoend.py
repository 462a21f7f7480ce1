"""EndToEndDP (Ramadan et al., Algorithm 2): private (S, ρ) selection, then BayesianDP.

Steps (paper §3.3 and §4.3):
  1. Split the reports at random (from ``rng``): each report joins the validation set U₁
     independently with probability 0.1, otherwise the training set U₂ (90%). The split looks
     at neither the data nor their number, as the composition argument needs (a split into
     round(0.1·n) reports would depend on n).
  2. For every grid point k = (S_k, ρ_k): μ_ps⁽ᵏ⁾ = ρ_k·w_k⊙x̂₂ + (1−ρ_k)·μ_p from the training set,
     and its sensitivity γ_k (the BayesianDP sensitivity method of the parameters).
  3. Score q_k = q(c₁, μ_ps⁽ᵏ⁾) = −Σ_i c₁ᵢ·log softmax(μ_ps⁽ᵏ⁾)_i (equation 6) with the clamped
     validation totals c₁.
  4. Report-noisy-min: k* = argmin_k q_k + Lap(2|Δq|/ε₁) (Theorem 2; the paper writes the
     Laplace argument as ε/(2|Δq|), but its proof uses scale 2|Δq|/ε, which we use), ε₁-DP.
  5. Release BayesianDP(U₂, S_{k*}, ρ_{k*}) with ε₂ and δ.
Budget (§4.3): ε₁ = ε/3 for the selection, ε₂ = 2ε/3 for the release; by sequential
composition the whole output is (ε₁ + ε₂, δ) = (ε, δ)-DP.

Sensitivity |Δq| (Claim 2). With one report per user, the user is in exactly one of the two
sets (|Δq| = the larger of the two terms below); with m > 1 reports per user some may be in
each set, so the terms add:
  * in U₂: |q(c₁, μ) − q(c₁, μ')| ≤ G·‖μ − μ'‖₂ = G·ρ_k·γ_k, with G = sup over the segment of
    ‖∇_μ q‖₂ = ‖‖c₁‖₁·θ − c₁‖₂ ≤ max over vertices of the simplex = sqrt(‖c₁‖₂² − 2·min(c₁)·‖c₁‖₁
    + ‖c₁‖₁²). (The paper's proof writes ∂q/∂r_i = c_i·ρ(1 − θ_i), which drops the cross terms of
    the log-sum-exp; its Lipschitz constant ρ‖c‖₂ is therefore too small. We use the correct G.)
  * in U₁: |q(c₁, μ) − q(c₁ − Δc, μ)| = |Σ_i Δc_i·log θ_i|.
Modes:
  * sensitivity "bruteforce" / "claim1" (the paper's method, data-dependent): γ_k from the
    training data, G from the observed c₁, and the U₁ term brute-forced over the present users.
  * sensitivity "sound" (needs W, the clip M and the validation cap n₁ ≤ ``validation_cap``):
    γ_k = sound_gamma (item totals clipped at M); a validation set larger than the cap is cut to
    a uniformly random subset of ``validation_cap`` reports, which turns add/remove into
    replace-one for the validation term, so that term doubles: ≤ 2·m·W·C·max_i(−log θ_i) with
    −log θ_i ≤ log V + range(μ_ps) ≤ log V + ρ·log(1 + M) + (1−ρ)·range(μ_p); and
    G ≤ √2·‖c₁‖₁ ≤ √2·validation_cap·W·C. Everything depends on public parameters only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import numpy as np
import scipy.sparse as sp

from lac.common.checks import check_int
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit, check_delta, check_epsilon
from lac.common.rng import RandomSource, secure_generator
from lac.curator.release.bayesian import (
    SENSITIVITY_METHODS,
    BayesianParams,
    BayesianRelease,
    _claim1_from_stats,
    bayesian_dp,
    bruteforce_sq_dists,
    count_stats,
    decay_weights,
    log_mean_center,
    prior_mean,
)
from lac.curator.release.gaussian import METHODS as _CALIBRATIONS
from lac.curator.release.sound import SOUND_STATEMENT, cap_rows, sound_caps, sound_gamma

__all__ = [
    "EndToEndParams",
    "EndToEndRelease",
    "cross_entropy_score",
    "end_to_end_dp",
    "DEFAULT_S_GRID",
    "DEFAULT_RHO_GRID",
]

DEFAULT_S_GRID = tuple(float(10.0**e) for e in range(-3, 5))  # S ∈ [1e-3, 1e4] (§4.3)
DEFAULT_RHO_GRID = (0.5, 0.7, 0.9, 0.99)
SELECTION_SHARE = 1.0 / 3.0  # §4.3: ε/3 for tuning, 2ε/3 for the release
VALIDATION_FRACTION = 0.1  # §4.3: 90% train / 10% validation


@dataclass(frozen=True)
class EndToEndParams:
    """Total budget (ε, δ) and the (S, ρ) grid; validated like ``BayesianParams``."""

    epsilon: float
    delta: float
    S_grid: tuple[float, ...] = DEFAULT_S_GRID
    rho_grid: tuple[float, ...] = DEFAULT_RHO_GRID
    C: int = 1
    sensitivity: str = "sound"
    calibration: str = "auto"
    W: int | None = None
    count_clip: int | None = None
    validation_cap: int = 100_000
    unit: PrivacyUnit = PrivacyUnit.report()
    validation_fraction: float = VALIDATION_FRACTION
    selection_share: float = SELECTION_SHARE

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta, allow_zero=False)
        check_int(self.validation_cap, "validation_cap")
        object.__setattr__(self, "S_grid", tuple(float(s) for s in self.S_grid))
        object.__setattr__(self, "rho_grid", tuple(float(r) for r in self.rho_grid))
        if not self.S_grid or not self.rho_grid:
            raise ValueError("the (S, rho) grid is empty")
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise ValueError(f"sensitivity must be one of {SENSITIVITY_METHODS}, got {self.sensitivity!r}")
        if self.calibration not in _CALIBRATIONS:
            raise ValueError(f"calibration must be one of {_CALIBRATIONS}, got {self.calibration!r}")
        for name in ("validation_fraction", "selection_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, Real) and 0 < float(v) < 1):
                raise ValueError(f"{name} must be in (0, 1), got {v!r}")
        # Every grid point must make a valid BayesianParams with the release budget.
        for S in self.S_grid:
            for rho in self.rho_grid:
                self.bayesian(S, rho)

    @property
    def epsilon_select(self) -> float:
        """ε₁: the share of ε spent on the private (S, ρ) selection."""
        return self.epsilon * self.selection_share

    @property
    def epsilon_release(self) -> float:
        """ε₂ = ε − ε₁: what the BayesianDP release spends."""
        return self.epsilon - self.epsilon_select

    def sound_caps(self) -> tuple[int, int]:
        """The public caps (W, count_clip) of the sound sensitivity (always set when it is "sound")."""
        return sound_caps(self.W, self.count_clip)

    def bayesian(self, S: float, rho: float) -> BayesianParams:
        """The BayesianDP parameters of the release at grid point (S, ρ), with budget ε₂."""
        return BayesianParams(
            epsilon=self.epsilon_release,
            delta=self.delta,
            S=S,
            C=self.C,
            rho=rho,
            sensitivity=self.sensitivity,
            calibration=self.calibration,
            W=self.W,
            count_clip=self.count_clip,
            unit=self.unit,
        )


@dataclass(frozen=True, eq=False)
class EndToEndRelease:
    """Output of EndToEndDP. Publish ``release.log_theta``, the selected (S, ρ) and the budget;
    ``scores``, ``gammas`` and ``release.mean`` are operator-only (not private)."""

    release: BayesianRelease
    S: float
    rho: float
    index: int  # selected grid point (row-major over S_grid × rho_grid)
    grid: tuple[tuple[float, float], ...]
    scores: np.ndarray  # exact q_k (NOT private)
    gammas: np.ndarray  # γ_k of each grid point
    delta_q: float
    laplace_scale: float
    epsilon_select: float
    epsilon_release: float
    epsilon: float
    delta: float
    n_validation: int  # exact counts: library/operator only
    n_train: int
    params: EndToEndParams
    guarantee: Guarantee

    @property
    def data_dependent(self) -> bool:
        """True when the sensitivity was data-dependent: the release is not DP."""
        return self.guarantee.data_dependent

    @property
    def statement(self) -> str:
        """The release's guarantee in words."""
        return self.guarantee.statement()


def cross_entropy_score(c: np.ndarray, mu: np.ndarray) -> float:
    """Equation 6: q(c, μ) = −Σ_i c_i (μ_i − log Σ_j exp μ_j)."""
    mu = np.asarray(mu, dtype=np.float64)
    top = mu.max()
    lse = top + math.log(np.exp(mu - top).sum())
    return float(-np.dot(np.asarray(c, dtype=np.float64), mu - lse))


def _lipschitz(c1: np.ndarray) -> float:
    """sup over θ in the simplex of ‖‖c‖₁θ − c‖₂ (a convex function of θ: attained at a vertex)."""
    T = float(c1.sum())
    if T == 0:
        return 0.0
    return math.sqrt(max(float(np.dot(c1, c1)) - 2.0 * float(c1.min()) * T + T * T, 0.0))


def end_to_end_dp(
    U: sp.spmatrix | sp.sparray,
    alpha: np.ndarray,
    params: EndToEndParams,
    rng: RandomSource | None = None,
) -> EndToEndRelease:
    """Algorithm 2 on per-user counts U (rows = users). Noise and the split come from ``rng``
    (default: the ``lac.common.rng`` CSPRNG). Guarantee: see the module docstring and ``statement``."""
    if not isinstance(params, EndToEndParams):
        raise TypeError("params must be an EndToEndParams")
    if not sp.issparse(U):
        raise TypeError(f"expected a scipy.sparse matrix, got {type(U).__name__}")
    alpha = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if U.shape[1] != alpha.size or alpha.size == 0:
        raise ValueError(f"U has {U.shape[1]} columns but alpha has {alpha.size} entries")
    rng = secure_generator() if rng is None else rng
    C, V = int(params.C), int(alpha.size)
    sound = params.sensitivity == "sound"
    W, M = params.sound_caps() if sound else (0, 0)  # the caps are used only when sound
    m = params.unit.max_reports if sound else 1
    U = cap_rows(U, W) if sound else sp.csr_matrix(U)

    n = U.shape[0]
    in_validation = rng.random(n) < params.validation_fraction  # one independent coin per report
    val_rows = np.flatnonzero(in_validation)
    if sound and val_rows.size > params.validation_cap:
        val_rows = np.sort(rng.choice(val_rows, size=params.validation_cap, replace=False))
    U1, U2 = U[val_rows], U[np.flatnonzero(~in_validation)]
    n1 = int(val_rows.size)

    stats1, stats2 = count_stats(U1, C), count_stats(U2, C)
    c1 = stats1.c
    mu_p = prior_mean(alpha)
    xhat2 = log_mean_center(np.minimum(stats2.c, M) if sound else stats2.c)
    grid = tuple((S, rho) for S in params.S_grid for rho in params.rho_grid)

    gamma_of_S: dict[float, float] = {}
    for S in params.S_grid:
        if sound:
            g = sound_gamma(S, C, W, V, M, m)
        elif params.sensitivity == "bruteforce":
            sq = bruteforce_sq_dists(U2, stats2, S, C)
            g = float(math.sqrt(sq.max())) if sq.size else 0.0
        else:
            g = _claim1_from_stats(stats2, S, C)
        gamma_of_S[S] = g

    scores = np.empty(len(grid))
    gammas = np.empty(len(grid))
    log_thetas = []
    for k, (S, rho) in enumerate(grid):
        mu = rho * (decay_weights(stats2.N, S, C) * xhat2) + (1.0 - rho) * mu_p
        top = mu.max()
        log_theta = mu - (top + math.log(np.exp(mu - top).sum()))
        log_thetas.append(log_theta)
        scores[k] = float(-np.dot(c1, log_theta))
        gammas[k] = gamma_of_S[S]
    rhos = np.array([rho for _, rho in grid])

    if sound:
        L = math.log1p(M)
        G = math.sqrt(2.0) * params.validation_cap * W * C
        range_p = float(mu_p.max() - mu_p.min())
        term2 = G * float(np.max(rhos * gammas))
        term1 = 2.0 * m * W * C * max(math.log(V) + rho * L + (1.0 - rho) * range_p for rho in params.rho_grid)
    else:
        term2 = _lipschitz(c1) * float(np.max(rhos * gammas))
        term1 = 0.0
        if U1.nnz:
            D = U1.copy()
            D.data = np.minimum(D.data, C).astype(np.float64)
            for lt in log_thetas:
                term1 = max(term1, float(np.max(np.abs(D @ lt))))
    delta_q = max(term1, term2) if m == 1 else term1 + term2

    eps1 = params.epsilon_select
    scale = 2.0 * delta_q / eps1
    noisy = scores + (rng.laplace(0.0, scale, size=scores.size) if scale > 0 else 0.0)
    k_star = int(np.argmin(noisy))
    S_star, rho_star = grid[k_star]

    release = bayesian_dp(U2, alpha, params.bayesian(S_star, rho_star), rng=rng)
    how = (
        f"{SOUND_STATEMENT} for both |Δq| and γ (W={params.W}, C={C}, item totals clipped at "
        f"M={params.count_clip}, validation cap {params.validation_cap}, {m} report(s) per user)"
        if sound
        else f"data-dependent: γ ({params.sensitivity}) and |Δq| (Claim 2, with a corrected Lipschitz "
        f"constant) are computed on the observed data and cover removing a present report only"
    )
    guarantee = Guarantee(
        Model.CENTRAL,
        eps1 + params.epsilon_release,
        params.delta,
        release.guarantee.unit,
        Adjacency.ADD_REMOVE,
        "EndToEndDP (Ramadan et al., Algorithm 2)",
        data_dependent=not sound,
        details=(
            f"Sequential composition of report-noisy-min over {len(grid)} (S, ρ) grid points (ε₁ = {eps1:g}, Laplace "
            f"scale 2|Δq|/ε₁ = {scale:.6g}, |Δq| = {delta_q:.6g}, scored with equation 6 on a validation split of "
            f"independent 10% coins per report) and BayesianDP on the other reports (ε₂ = "
            f"{params.epsilon_release:g}, δ = {params.delta:g}, S = {S_star:g}, ρ = {rho_star:g}).",
            f"Sensitivities: {how}.",
            *release.guarantee.details,
        ),
    )
    scores.setflags(write=False)
    gammas.setflags(write=False)
    return EndToEndRelease(
        release=release,
        S=S_star,
        rho=rho_star,
        index=k_star,
        grid=grid,
        scores=scores,
        gammas=gammas,
        delta_q=float(delta_q),
        laplace_scale=float(scale),
        epsilon_select=eps1,
        epsilon_release=params.epsilon_release,
        epsilon=eps1 + params.epsilon_release,
        delta=params.delta,
        n_validation=n1,
        n_train=int(U2.shape[0]),
        params=params,
        guarantee=guarantee,
    )
