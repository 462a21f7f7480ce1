import math

import numpy as np
import pytest
from scipy.special import ndtr

from lac.curator.release.gaussian import analytic_log_delta, analytic_sigma, calibrate, classic_sigma

EPS_SMALL = [1e-3, 0.01, 0.1, 0.3, 0.5, 0.9, 0.999]
DELTAS = [1e-2, 1e-5, 1e-8, 1e-12]


def naive_delta(sigma, eps, sens=1.0):
    """Balle & Wang's condition evaluated directly; accurate where neither term underflows."""
    return ndtr(sens / (2 * sigma) - eps * sigma / sens) - math.exp(eps) * ndtr(
        -sens / (2 * sigma) - eps * sigma / sens
    )


def test_classic_formula():
    s = classic_sigma(2.0, 0.5, 1e-5)
    assert s == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-15)
    assert s > 2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5 * (1 - 1e-16)


@pytest.mark.parametrize("eps", [1.0, 1.5, 10.0])
def test_classic_refuses_eps_at_least_one(eps):
    with pytest.raises(ValueError, match="analytic"):
        classic_sigma(1.0, eps, 1e-5)
    with pytest.raises(ValueError, match="analytic"):
        calibrate(1.0, eps, 1e-5, "classic")


@pytest.mark.parametrize(
    "args",
    [
        (-1.0, 0.5, 1e-5),
        (math.inf, 0.5, 1e-5),
        (1.0, 0.0, 1e-5),
        (1.0, -1, 1e-5),
        (1.0, 0.5, 0.0),
        (1.0, 0.5, 1.0),
        (1.0, math.nan, 1e-5),
    ],
)
def test_invalid_arguments(args):
    with pytest.raises(ValueError):
        analytic_sigma(*args)
    with pytest.raises(ValueError):
        classic_sigma(*args)


@pytest.mark.parametrize("eps", EPS_SMALL)
@pytest.mark.parametrize("delta", DELTAS)
def test_analytic_tighter_than_classic(eps, delta):
    assert analytic_sigma(1.0, eps, delta) <= classic_sigma(1.0, eps, delta)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-8])
def test_condition_holds_at_sigma_and_fails_just_below(eps, delta):
    s = analytic_sigma(1.0, eps, delta)
    # the module's log-space evaluation
    assert analytic_log_delta(1.0 / s, eps) <= math.log(delta)
    assert analytic_log_delta(1.0 / (s * (1 - 1e-9)), eps) > math.log(delta)
    # an independent direct evaluation (accurate in this range)
    assert naive_delta(s, eps) <= delta * (1 + 1e-9)
    assert naive_delta(s * (1 - 1e-7), eps) > delta


@pytest.mark.parametrize("eps", [20.0, 100.0, 1e3, 1e5])
@pytest.mark.parametrize("delta", [1e-6, 1e-12, 1e-100])
def test_large_epsilon_and_tiny_delta(eps, delta):
    s = analytic_sigma(1.0, eps, delta)
    assert math.isfinite(s) and s > 0
    assert analytic_log_delta(1.0 / s, eps) <= math.log(delta)
    assert analytic_log_delta(1.0 / (s * (1 - 1e-9)), eps) > math.log(delta)


def test_known_value():
    # Balle & Wang (2018): eps = 1, delta = 1e-5, sensitivity 1 -> sigma ~= 3.73
    assert analytic_sigma(1.0, 1.0, 1e-5) == pytest.approx(3.7306, abs=1e-4)


def test_monotone_and_linear():
    sig = [analytic_sigma(1.0, e, 1e-6) for e in np.geomspace(1e-3, 1e3, 25)]
    assert all(a > b for a, b in zip(sig, sig[1:]))
    sig_d = [analytic_sigma(1.0, 1.0, d) for d in np.geomspace(1e-15, 0.5, 25)]
    assert all(a > b for a, b in zip(sig_d, sig_d[1:]))
    assert analytic_sigma(3.5, 0.7, 1e-6) == pytest.approx(3.5 * analytic_sigma(1.0, 0.7, 1e-6), rel=1e-10)


def test_zero_sensitivity():
    assert analytic_sigma(0.0, 1.0, 1e-5) == 0.0
    assert classic_sigma(0.0, 0.5, 1e-5) == 0.0
    assert calibrate(0.0, 2.0, 1e-5) == (0.0, "analytic")


def test_calibrate_methods():
    assert calibrate(1.0, 0.5, 1e-5, "classic") == (classic_sigma(1.0, 0.5, 1e-5), "classic")
    assert calibrate(1.0, 0.5, 1e-5, "analytic") == (analytic_sigma(1.0, 0.5, 1e-5), "analytic")
    # "auto" is always the analytic mechanism (valid for all eps, never looser)
    assert calibrate(1.0, 0.5, 1e-5, "auto") == (analytic_sigma(1.0, 0.5, 1e-5), "analytic")
    assert calibrate(1.0, 3.0, 1e-5) == (analytic_sigma(1.0, 3.0, 1e-5), "analytic")
    with pytest.raises(ValueError, match="unknown calibration"):
        calibrate(1.0, 0.5, 1e-5, "laplace")


def _exact_delta(mu: float, eps: float):
    """δ(ε) of the Gaussian mechanism with Δ/σ = mu, in 80-digit arithmetic (the reference)."""
    import mpmath

    with mpmath.workdps(80):
        mu_, eps_ = mpmath.mpf(mu), mpmath.mpf(eps)
        a = mu_ / 2 - eps_ / mu_
        return mpmath.ncdf(a) - mpmath.e**eps_ * mpmath.ncdf(a - mu_)


def _direct_log_delta(mu: float, eps: float) -> float:
    """The evaluation before the fix: the difference of two log Φ, which cancel at small ε and tiny δ."""
    from scipy.special import log_ndtr

    a = mu / 2 - eps / mu
    la = float(log_ndtr(a))
    t = eps + float(log_ndtr(a - mu)) - la
    return la + math.log(-math.expm1(t))


EXACT_EPS = [1e-6, 1e-4, 1e-2, 0.3, 1.0, 4.6, 100.0, 1e4, 1e6]  # the RPC's ε range is [1e-6, 1e6]
EXACT_DELTAS = [0.5, 1e-5, 1e-20, 1e-50, 1e-100]  # the RPC's δ floor is 1e-100


@pytest.mark.parametrize("delta", EXACT_DELTAS)
def test_sigma_sound_against_exact_arithmetic_over_the_rpc_range(delta):
    """Issue 23.17: σ never lets δ exceed what was asked, checked in 80-digit arithmetic over the whole
    range the RPC accepts, and it is tight (within 1e-6 relative of δ)."""
    for eps in EXACT_EPS:
        s = analytic_sigma(1.0, eps, delta)
        exact = _exact_delta(1.0 / s, eps)
        assert exact <= delta, (eps, delta, float(exact / delta))
        assert exact >= delta * (1 - 1e-6), (eps, delta, float(exact / delta))


def test_exact_check_catches_the_cancelling_evaluation():
    """The audit above can fail: near the root at δ = 1e-100 and ε = 1e-6 the old direct evaluation
    accepts noise scales whose exact δ exceeds the request (the review measured δ·(1 + 3e-5)); the
    stable evaluation refuses every one of them."""
    eps, delta = 1e-6, 1e-100
    root = 1.0 / analytic_sigma(1.0, eps, delta)
    wrongly_accepted = []
    for mu in root * (1 + np.linspace(0, 2e-6, 201)):
        mu = float(mu)
        exact = _exact_delta(mu, eps)
        if exact > delta and _direct_log_delta(mu, eps) <= math.log(delta):
            wrongly_accepted.append(float(exact / delta))
            assert analytic_log_delta(mu, eps) > math.log(delta)
    assert wrongly_accepted and max(wrongly_accepted) > 1 + 1e-7
