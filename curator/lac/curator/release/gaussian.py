"""Calibration of the Gaussian mechanism M(D) = f(D) + N(0, σ² I).

All functions take the ℓ2 sensitivity Δ = max over adjacent D, D' of ‖f(D) − f(D')‖₂ and
return a noise scale σ such that M is (ε, δ)-differentially private under that adjacency.
A sensitivity of 0 gives σ = 0 (the output does not depend on the protected unit).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr

from lac.common.privacy import check_delta, check_epsilon

__all__ = ["classic_sigma", "analytic_sigma", "calibrate", "analytic_log_delta", "METHODS"]

METHODS = ("classic", "analytic", "auto")


def _check(sensitivity: float, epsilon: float, delta: float) -> None:
    if not (math.isfinite(sensitivity) and sensitivity >= 0):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    check_epsilon(epsilon)
    check_delta(delta, allow_zero=False)


def classic_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·sqrt(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Theorem A.1).

    Guarantee: (ε, δ)-DP for 0 < ε < 1 only; the theorem says nothing for ε >= 1, so this
    raises ValueError there (use ``analytic_sigma``). The result is rounded up by one ulp
    because the theorem asks for a strict inequality.
    """
    _check(sensitivity, epsilon, delta)
    if epsilon >= 1:
        raise ValueError(
            f"classic Gaussian calibration (Dwork-Roth Thm A.1) is only valid for 0 < epsilon < 1, "
            f"got epsilon={epsilon}; use the analytic Gaussian mechanism (analytic_sigma, "
            f"method='analytic' or 'auto') for epsilon >= 1"
        )
    if sensitivity == 0:
        return 0.0
    sigma = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    return math.nextafter(sigma, math.inf)


def analytic_log_delta(mu: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism with Δ/σ = ``mu`` (Balle & Wang 2018, Thm 8).

    δ(ε) = Φ(a) − e^ε Φ(a − μ) with a = μ/2 − ε/μ, evaluated as log Φ(a) + log(1 − e^t) with
    t = ε + log Φ(a − μ) − log Φ(a) < 0, so that nothing over/underflows for large ε or tiny δ.
    Where t is small the two logarithms nearly cancel (at δ = 1e-100 and ε = 1e-6 that cost δ a
    relative 3e-5, making σ unsound); there t is computed without cancellation, as
    t = −∫_{a−μ}^{a} (λ(x) + x) dx with λ = φ/Φ the inverse Mills ratio, because ∫(−x)dx over that
    interval is exactly ε. Returns −inf where δ rounds to 0.
    """
    if mu <= 0:
        return -math.inf
    a = mu / 2.0 - epsilon / mu
    la = float(log_ndtr(a))
    if not math.isfinite(la):
        return -math.inf
    t = epsilon + float(log_ndtr(a - mu)) - la
    if t > -_DIRECT_T:  # cancellation: integrate the excess of the inverse Mills ratio instead
        x = a - mu / 2.0 + (mu / 2.0) * _GL_NODES
        excess = np.exp(_LOG_PHI0 - 0.5 * x * x - log_ndtr(x)) + x
        t = -(mu / 2.0) * float(np.dot(_GL_WEIGHTS, excess))
    if not t < 0:
        return -math.inf
    return la + math.log(-math.expm1(t))


_DIRECT_T = 1e-2  # |t| above this: the direct difference loses at most ~|log Φ(a)|·1e-14 relative
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)
_LOG_PHI0 = -0.5 * math.log(2.0 * math.pi)
# σ is calibrated to δ·(1 − 1e-9): the evaluation above is accurate to ~1e-12 relative (checked against
# 80-digit arithmetic over ε ∈ [1e-6, 1e6], δ ∈ [1e-100, 0.5]), so the δ asked for is never exceeded.
_LOG_DELTA_MARGIN = 1e-9


def analytic_sigma(sensitivity: float, epsilon: float, delta: float, tol: float = 1e-12) -> float:
    """Smallest σ of the analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8).

    Guarantee: M is (ε, δ)-DP for every ε > 0 iff
    Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) <= δ; this is exact (not a bound), hence never
    larger than ``classic_sigma`` where that is valid. The condition is monotone in μ = Δ/σ,
    so μ is found by geometric bisection to relative width ``tol``, keeping the side that
    satisfies the condition; the returned σ is then checked against the condition (with a
    relative margin of 1e-9 on δ for the error of its evaluation) and nudged up if rounding put
    it below the root.
    """
    _check(sensitivity, epsilon, delta)
    if not (0 < tol < 1e-3):
        raise ValueError(f"tol must be in (0, 1e-3), got {tol!r}")
    if sensitivity == 0:
        return 0.0
    log_delta = math.log(delta) - _LOG_DELTA_MARGIN

    def ok(mu: float) -> bool:
        return analytic_log_delta(mu, epsilon) <= log_delta

    mu0 = epsilon / math.sqrt(2.0 * math.log(1.25 / delta))
    lo = hi = mu0
    for _ in range(2000):
        if ok(lo):
            break
        lo /= 2.0
    else:  # pragma: no cover - δ(μ) → 0 as μ → 0, so this needs a broken log_ndtr
        raise ArithmeticError("analytic_sigma: could not bracket the root from below")
    for _ in range(2000):
        if not ok(hi):
            break
        hi *= 2.0
    else:  # pragma: no cover
        raise ArithmeticError("analytic_sigma: could not bracket the root from above")
    if hi == lo:
        hi = lo * 2.0
        while ok(hi):
            lo, hi = hi, hi * 2.0
    while hi / lo - 1.0 > tol:
        mid = math.sqrt(lo * hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    sigma = sensitivity / lo
    for _ in range(64):
        if ok(sensitivity / sigma):
            return sigma
        sigma = math.nextafter(sigma, math.inf)
    raise ArithmeticError("analytic_sigma: rounding did not converge")  # pragma: no cover


def calibrate(sensitivity: float, epsilon: float, delta: float, method: str = "auto") -> tuple[float, str]:
    """(σ, method_used) for ``method`` in "classic" | "analytic" | "auto".

    "auto" always uses the analytic mechanism: it is valid for every ε > 0 and never gives a
    larger σ than the classic formula where the latter is valid. "classic" raises for ε >= 1.
    """
    if method == "classic":
        return classic_sigma(sensitivity, epsilon, delta), "classic"
    if method in ("analytic", "auto"):
        return analytic_sigma(sensitivity, epsilon, delta), "analytic"
    raise ValueError(f"unknown calibration method {method!r}; expected one of {METHODS}")
