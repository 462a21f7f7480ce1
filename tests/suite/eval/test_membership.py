"""The membership-inference audit can fail: verdicts, the certifiable-ε ceiling, and attacks on real mechanisms.

The mechanisms run on a small synthetic count matrix (a statistical unit test, not language): 300 users
over 200 items, the audited user holding W = 20 rare items. Every test seeds its generator, so it is
deterministic; where a test asserts "not violated" for a correctly calibrated mechanism, the chance
that an unlucky seed would flag it is at most 1 − CONF = 1% (the Clopper–Pearson guarantee), and far
less in fact (the attack succeeds ≈ 55% of the time; a violation at ε = 1 needs ≥ 88%).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from lac.curator.release.baselines import laplace_dp
from lac.curator.release.gaussian import analytic_sigma
from lac.suite.eval import report
from lac.suite.eval.membership import audit, overall_check, row_confidence
from lac.suite.eval.metrics import audit_verdict, epsilon_lower_bound, max_certifiable_epsilon, trials_needed

W, C, V, USERS = 20, 1, 200, 300
DELTA = 1e-6
CONF = 0.99
LAM = 1e-4


@pytest.fixture(scope="module")
def adjacent():
    """(U, U without user 0, user 0's normalised counts); user 0 holds the W rarest items."""
    g = np.random.default_rng(7)
    zipf = 1.0 / np.arange(1, V + 1)
    items = [np.arange(V - W, V)] + [
        g.choice(V, size=int(g.integers(1, W + 1)), replace=False, p=zipf / zipf.sum()) for _ in range(USERS - 1)
    ]
    r = np.concatenate([np.full(len(x), i) for i, x in enumerate(items)])
    U = sp.csr_matrix((np.ones(r.size), (r, np.concatenate(items))), shape=(USERS, V))
    pu = U[0].toarray().ravel()
    return U, U[1:], pu / pu.sum()


def _counts(U, U_minus, eps):
    """The Laplace release of lac.curator on each data set: (pre-noise counts, scale) pairs."""
    a = laplace_dp(U, W=W, C=C, epsilon=eps, rng=np.random.default_rng(0))
    b = laplace_dp(U_minus, W=W, C=C, epsilon=eps, rng=np.random.default_rng(0))
    return (np.asarray(a.mean), a.scale), (np.asarray(b.mean), b.scale)


def _gaussian(U, U_minus, eps, shrink=1.0):
    """Gaussian mechanism on the clamped counts, ℓ2 sensitivity √W·C, analytic σ divided by ``shrink``."""
    (m1, _), (m0, _) = _counts(U, U_minus, eps)
    sigma = analytic_sigma(math.sqrt(W) * C, eps, DELTA) / shrink
    return (m1, sigma), (m0, sigma)


# -- the statistics --------------------------------------------------------------------------------------------


def test_max_certifiable_epsilon_is_the_perfect_attack_bound():
    for n, expected in ((40, 1.277), (200, 2.097), (400, 2.445), (2000, 3.251)):
        assert max_certifiable_epsilon(n, 0.0, 0.95) == pytest.approx(expected, abs=1e-3)
        assert max_certifiable_epsilon(n, 0.0, 0.95) == epsilon_lower_bound(n, n, 0.0, 0.95)
    # It grows like ½·log n: 400 pairs can never refute ε = 100.
    assert max_certifiable_epsilon(400, 0.0, 0.95) < 2.5
    assert max_certifiable_epsilon(10**6, 0.0, 0.95) < 7
    # δ and a stricter confidence lower it.
    assert max_certifiable_epsilon(400, 1e-3, 0.95) < max_certifiable_epsilon(400, 0.0, 0.95)
    assert max_certifiable_epsilon(400, 0.0, 0.999) < max_certifiable_epsilon(400, 0.0, 0.95)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 2.45, 5.0, 10.0])
@pytest.mark.parametrize("delta,conf", [(0.0, 0.95), (DELTA, 0.99), (DELTA, row_confidence(0.95, 27))])
def test_trials_needed_is_the_smallest_sufficient_count(eps, delta, conf):
    n = trials_needed(eps, delta, conf)
    assert max_certifiable_epsilon(n, delta, conf) > eps
    assert n == 1 or max_certifiable_epsilon(n - 1, delta, conf) <= eps


def test_trials_needed_grows_like_exp_2eps():
    assert trials_needed(1.0, 0.0, 0.95) == 24
    assert trials_needed(2.445, 0.0, 0.95) == 400
    n100 = trials_needed(100.0, 0.0, 0.95)
    assert math.log(n100) == pytest.approx(200 + math.log(math.log(20)), rel=1e-6)
    assert trials_needed(1000.0, 0.0, 0.95) == math.inf


def test_verdicts():
    # A perfect attack over 400 pairs refutes ε = 2 but cannot test ε = 100.
    assert audit_verdict(400, 400, 2.0, 0.0, 0.95)["verdict"] == "violated"
    v = audit_verdict(400, 400, 100.0, 0.0, 0.95)
    assert v["verdict"] == "inconclusive" and v["trials_needed"] > 10**80
    # Chance-level success: consistent where testable, inconclusive where not.
    assert audit_verdict(200, 400, 1.0, 0.0, 0.95)["verdict"] == "consistent"
    assert audit_verdict(200, 400, 5.0, 0.0, 0.95)["verdict"] == "inconclusive"
    assert row_confidence(0.95, 27) == pytest.approx(1 - 0.05 / 27)


def _row(mech, eps, verdict, need=None):
    return {"mechanism": mech, "epsilon": eps, "verdict": verdict, "max_certifiable_eps": 2.07, "trials_needed": need}


def test_overall_check():
    ok = [
        _row("laplace", 1.0, "consistent"),
        _row("laplace", 100.0, "inconclusive", 10**87),
        _row("bayes-sound", 2.0, "consistent"),
        _row("bayes", 1.0, "violated"),
    ]
    c = overall_check(ok)
    assert c["check"] == "PASS" and c["sound_never_exceeded"]
    assert c["conclusive_up_to"] == 2.0 and c["inconclusive_from"] == 100.0
    assert c["trials_needed_at_inconclusive_from"] == 10**87
    bad = overall_check(ok + [_row("bayes-sound", 0.5, "violated")])
    assert bad["check"] == "FAIL" and not bad["sound_never_exceeded"] and bad["sound_violated"] == [0.5]
    # The finding: only untestable rows used to print PASS; now it says so.
    none = overall_check([_row("laplace", 100.0, "inconclusive", 10**87), _row("bayes", 1.0, "consistent")])
    assert none["check"] == "INCONCLUSIVE" and none["sound_never_exceeded"]


def test_report_states_the_inconclusive_range_and_false_alarm_rate():
    rows = [_row("laplace", 1.0, "consistent"), _row("laplace", 100.0, "inconclusive", 3 * 10**87)]
    m = {**overall_check(rows), "samples": 400, "rows_tested": 27, "false_alarm_bound": 0.05}
    line = report.summary({"membership": m})
    assert "PASS for claimed ε ≤ 1" in line and "INCONCLUSIVE for ε ≥ 100" in line
    assert "false-alarm rate ≤ 5%" in line and "3e+87 pairs" in line
    m = {
        **overall_check(rows + [_row("laplace", 0.5, "violated")]),
        "samples": 400,
        "rows_tested": 27,
        "false_alarm_bound": 0.05,
    }
    assert "FAIL" in report.summary({"membership": m})


# -- the attack on real mechanisms -----------------------------------------------------------------------------


def test_audit_flags_a_gaussian_mechanism_with_20x_too_little_noise(adjacent):
    U, U_minus, pu = adjacent
    d_in, d_out = _gaussian(U, U_minus, 1.0, shrink=20.0)
    row = audit("counts-gauss", d_in, d_out, pu, 2000, 1.0, DELTA, CONF, LAM, np.random.default_rng(1))
    assert row["verdict"] == "violated" and row["exceeds_claim"]
    assert row["eps_lower_bound"] > 1.3


def test_audit_flags_an_exact_leak_with_the_predicted_number_of_trials(adjacent):
    U, U_minus, pu = adjacent
    (m1, _), (m0, _) = _counts(U, U_minus, 1.0)
    n = trials_needed(1.0, 0.0, CONF)  # 37 pairs at 99%
    row = audit("laplace", (m1, 0.0), (m0, 0.0), pu, n, 1.0, 0.0, CONF, LAM, np.random.default_rng(2))
    assert row["wins"] == n and row["verdict"] == "violated"
    # One pair fewer and the same perfect attack cannot refute ε = 1.
    row = audit("laplace", (m1, 0.0), (m0, 0.0), pu, n - 1, 1.0, 0.0, CONF, LAM, np.random.default_rng(2))
    assert row["wins"] == n - 1 and row["verdict"] == "inconclusive"


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_calibrated_laplace_and_gaussian_are_not_flagged(adjacent, eps):
    U, U_minus, pu = adjacent
    for kind, (d_in, d_out), delta in (
        ("laplace", _counts(U, U_minus, eps), 0.0),
        ("counts-gauss", _gaussian(U, U_minus, eps), DELTA),
    ):
        row = audit(kind, d_in, d_out, pu, 2000, eps, delta, CONF, LAM, np.random.default_rng(3))
        assert row["verdict"] == "consistent", (kind, row)
        assert row["eps_lower_bound"] < eps


def test_huge_claimed_epsilon_is_inconclusive_even_for_an_attack_that_always_wins(adjacent):
    U, U_minus, pu = adjacent
    d_in, d_out = _counts(U, U_minus, 100.0)  # Laplace at ε = 100: the attack wins every pair
    rows = []
    for n in (40, 200):
        row = audit("laplace", d_in, d_out, pu, n, 100.0, 0.0, 0.95, LAM, np.random.default_rng(4))
        assert row["wins"] == n
        assert row["verdict"] == "inconclusive" and not row["exceeds_claim"]
        assert row["eps_lower_bound"] == row["max_certifiable_eps"] < 2.1
        assert row["trials_needed"] > 10**86
        rows.append({"mechanism": "laplace", **row})
    assert overall_check(rows)["check"] == "INCONCLUSIVE"
