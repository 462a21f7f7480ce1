"""The privacy types of lac.common.privacy on their own: Budget (validation, composition, fits, minus),
PrivacyUnit (kinds, max_reports, describe) and Guarantee (every rendering, the data-dependent label), with exact
strings and numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lac.common.privacy import (
    DATA_DEPENDENT_PREFIX,
    Adjacency,
    Budget,
    ErrorBarMethod,
    ErrorBars,
    ExportedWindows,
    Guarantee,
    LocalGuarantee,
    Model,
    PrivacyUnit,
    WindowShuffle,
    check_delta,
    check_epsilon,
)

# ------------------------------------------------------------------------------------------------ checks


def test_check_epsilon_and_delta():
    assert check_epsilon(2) == 2.0 and type(check_epsilon(np.float32(0.5))) is float
    assert check_epsilon(0, allow_zero=True) == 0.0
    for bad in (0, -1.0, math.inf, math.nan, True, "1", None):
        with pytest.raises(ValueError) as e:
            check_epsilon(bad)
        assert str(e.value) == f"epsilon must be a finite number > 0, got {bad!r}"
    with pytest.raises(ValueError, match=r"^eps0 must be a finite number >= 0, got -1$"):
        check_epsilon(-1, "eps0", allow_zero=True)
    assert check_delta(0) == 0.0 and check_delta(1e-6) == 1e-6
    for bad in (1, 1.5, -1e-9, math.nan, False, "0.1"):
        with pytest.raises(ValueError) as e:
            check_delta(bad)
        assert str(e.value) == f"delta must be in [0, 1), got {bad!r}"
    with pytest.raises(ValueError, match=r"^delta must be in \(0, 1\), got 0$"):
        check_delta(0, allow_zero=False)


# ------------------------------------------------------------------------------------------------ Budget


def test_budget_validates_and_defaults_to_pure():
    assert Budget(1).delta == 0.0 and Budget(1).epsilon == 1.0 and type(Budget(1).epsilon) is float
    assert Budget(0.0, 0.0) == Budget(0, 0)
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        Budget(-0.1)
    with pytest.raises(ValueError, match=r"delta must be in \[0, 1\)"):
        Budget(1.0, 1.0)
    with pytest.raises(AttributeError):
        Budget(1.0).epsilon = 2.0  # type: ignore[misc]


def test_budget_addition_is_basic_composition():
    assert Budget(0.5, 1e-6) + Budget(0.25, 2e-6) == Budget(0.75, 3e-6)
    # δ never reaches 1: the sum stops just below it
    assert (Budget(1, 0.6) + Budget(1, 0.6)).delta == math.nextafter(1.0, 0.0)
    total = Budget(0.0)
    for _ in range(10):
        total = total + Budget(0.1)
    assert total.epsilon != 1.0  # 0.9999999999999999: rounding...
    assert total.fits(Budget(1.0))  # ...which fits allows for (relative 1e-9)


def test_budget_fits_and_minus():
    limit = Budget(1.0, 1e-5)
    assert Budget(1.0, 1e-5).fits(limit)
    assert Budget(1.0 * (1 + 1e-10), 1e-5).fits(limit)
    assert not Budget(1.0 * (1 + 1e-8), 1e-5).fits(limit)
    assert not Budget(0.5, 2e-5).fits(limit)
    assert limit.minus(Budget(0.25, 1e-6)) == Budget(0.75, 9e-6)
    assert limit.minus(Budget(3.0, 1e-3)) == Budget(0.0, 0.0)  # never negative
    assert str(Budget(0.123456789, 1.23456e-6)) == "(ε, δ) = (0.123457, 1.23e-06)"


# ------------------------------------------------------------------------------------------------ PrivacyUnit


def test_privacy_unit_kinds_and_max_reports():
    assert PrivacyUnit.word() == PrivacyUnit("word") and PrivacyUnit.word().max_reports == 1
    assert PrivacyUnit.report(40) == PrivacyUnit("report", max_words=40) and PrivacyUnit.report().max_reports == 1
    assert PrivacyUnit.user(5) == PrivacyUnit("user", reports=5) and PrivacyUnit.user(5).max_reports == 5
    assert PrivacyUnit.user(1) == PrivacyUnit("report")  # one report per user is a report
    client = PrivacyUnit.client(2, 7, 86400)
    assert (client.reports_per_window, client.windows, client.window_seconds) == (2, 7, 86400.0)
    assert client.max_reports == 14
    for bad in (
        lambda: PrivacyUnit("household"),
        lambda: PrivacyUnit("user"),
        lambda: PrivacyUnit("user", reports=0),
        lambda: PrivacyUnit("client", reports_per_window=1, windows=1),
    ):
        with pytest.raises(ValueError):
            bad()


def test_privacy_unit_describe():
    assert PrivacyUnit.word().describe() == "one word"
    assert PrivacyUnit.report().describe() == "one report"
    assert PrivacyUnit.report(40).describe() == "one report (at most 40 words)"
    assert PrivacyUnit.user(3).describe() == "one user's reports (at most 3)"
    assert PrivacyUnit.client(1, 1, 86400).describe() == (
        "one client's contribution over 1 accounting window of 1 day (at most 1 report per window, so at most 1 in all)"
    )
    assert PrivacyUnit.client(2, 7, 3600).describe() == (
        "one client's contribution over 7 accounting windows of 1 hour "
        "(at most 2 reports per window, so at most 14 in all)"
    )
    assert PrivacyUnit.client(1, 2, 90).describe() == (
        "one client's contribution over 2 accounting windows of 90 s (at most 1 report per window, so at most 2 in all)"
    )


# ------------------------------------------------------------------------------------------------ Guarantee


def test_guarantee_validates_its_numbers():
    with pytest.raises(ValueError, match="epsilon"):
        Guarantee(Model.CENTRAL, -1.0, 0.0, PrivacyUnit.report(), Adjacency.ADD_REMOVE, "m")
    with pytest.raises(ValueError, match="delta"):
        Guarantee(Model.CENTRAL, 1.0, 1.0, PrivacyUnit.report(), Adjacency.ADD_REMOVE, "m")
    g = Guarantee(Model.CENTRAL, 1, 0, PrivacyUnit.report(), Adjacency.ADD_REMOVE, "m", details=["a"])
    assert g.details == ("a",) and g.budget == Budget(1.0, 0.0) and g.differentially_private


def test_metric_local_rendering():
    g = Guarantee(Model.METRIC_LOCAL, 8, 0, PrivacyUnit.word(), Adjacency.REPLACE, "multivariate-laplace over glove")
    assert (
        g.statement()
        == g.headline()
        == (
            "ε·d metric differential privacy for one word with ε = 8 per unit of distance "
            "(multivariate-laplace over glove): for all words w, w' and every output y, "
            "Pr[M(w)=y] ≤ exp(ε·d(w,w'))·Pr[M(w')=y]."
        )
    )


SAME_SHAPE = "the same number of words and the same sentence boundaries"


def test_local_rendering():
    unit = PrivacyUnit.report(40)
    g = Guarantee(Model.LOCAL, 6052.19, 0, unit, Adjacency.REPLACE_SAME_SHAPE, "laplace", details=("d1.",))
    assert g.headline() == (
        "6052.19-local differential privacy (pure, δ = 0) for one report (at most 40 words): any two inputs with "
        f"{SAME_SHAPE} (a report's length and sentence boundaries are not hidden) (laplace)."
    )
    assert g.statement() == g.headline() + " d1."


def test_report_level_and_shuffled_statements_hold_for_reports_of_the_same_shape_only():
    """Issue 34 item 4: ε0-LDP of a report, and every bound shuffling amplifies from it, hold only between reports
    with the same number of words and sentence boundaries (the length is visible): each statement says so, and
    no local or shuffled guarantee can be built under another adjacency."""
    for model in (Model.LOCAL, Model.SHUFFLED):
        for adjacency in (Adjacency.REPLACE, Adjacency.ADD_REMOVE):
            with pytest.raises(ValueError, match="same number of words"):
                Guarantee(model, 1.0, 0.0, PrivacyUnit.report(40), adjacency, "m")
    from lac.common.deployment import Deployment

    d = Deployment()
    assert SAME_SHAPE in d.report_guarantee().headline()
    amplified = WindowShuffle(7, 1, 100, 100, 0.5, 1e-6, True, "numerical")
    assert SAME_SHAPE in amplified.describe(5.0)
    exported = LocalGuarantee(
        "multivariate-laplace", 8.0, "glove", 18.9, 40, 1, 86400.0, 7, 7, 100, shuffles=(amplified,)
    )
    per_report = exported.statement().split("Per report: ")[1]
    assert SAME_SHAPE in per_report.split("Per client")[0], per_report


def test_shuffled_and_central_rendering_with_details_and_assumptions():
    unit = PrivacyUnit.report(40)
    shuffled = Guarantee(Model.SHUFFLED, 0.75, 1e-8, unit, Adjacency.REPLACE_SAME_SHAPE, "shuffle of 1000 reports")
    assert shuffled.headline() == (
        "(0.75, 1e-08)-differential privacy of the shuffled batch for " + unit.describe() + ", under replace "
        f"adjacency between inputs with {SAME_SHAPE} (a report's length and sentence boundaries are not hidden) "
        "(shuffle of 1000 reports)."
    )
    central = Guarantee(
        Model.CENTRAL,
        1.0,
        1e-6,
        PrivacyUnit.user(2),
        Adjacency.ADD_REMOVE,
        "bayesian",
        details=("Noise σ = 3.",),
        assumptions=("the shuffler's quota", "public caps"),
    )
    assert central.statement() == (
        "(1, 1e-06)-differential privacy of the release for one user's reports (at most 2), under add/remove "
        "adjacency (bayesian). Noise σ = 3. Assumes the shuffler's quota; public caps."
    )
    assert central.public_statement() == central.statement()  # nothing data-dependent to withhold


def test_data_dependent_is_labelled_and_its_details_withheld_from_the_public():
    g = Guarantee(
        Model.CENTRAL,
        0.5,
        1e-6,
        PrivacyUnit.report(),
        Adjacency.ADD_REMOVE,
        "bayesian (bruteforce sensitivity)",
        data_dependent=True,
        details=("Sensitivity 0.0123 from the data.",),
    )
    headline = (
        f"{DATA_DEPENDENT_PREFIX} bayesian (bruteforce sensitivity), nominally (0.5, 1e-06) for one report: "
        "the noise was calibrated to a sensitivity computed from the observed data, which is not a worst case "
        "over all data sets, so no differential-privacy guarantee follows."
    )
    assert g.headline() == headline and not g.differentially_private
    assert g.statement().startswith("NOT differentially private: ")
    assert g.statement() == headline + " Sensitivity 0.0123 from the data."
    assert g.public_statement() == (
        headline + " Its sensitivity and noise scale are computed from the data and are shown to operators only."
    )
    assert "0.0123" not in g.public_statement()


def test_exported_windows_render_their_span_and_how_releases_compose_with_them():
    assert ExportedWindows.of([]) is None
    whole = ExportedWindows.of([5, 6, 7], exports=2)
    assert whole == ExportedWindows(3, 5, 7, 2)
    assert "the privatized reports of windows 5..7 were also exported (2 exports)" in whole.caveat()
    assert "count central releases only" in whole.caveat() and "bounds further central releases only" in (
        whole.budget_note()
    )
    part = ExportedWindows.of([5, 7], later=True)
    assert "the privatized reports of 2 of windows 5..7 were later also exported," in part.caveat()
    with pytest.raises(ValueError):
        ExportedWindows(4, 5, 7)


# ------------------------------------------------------------------------------------------------ error bars


def test_error_bars_say_what_they_cover_how_and_what_they_leave_out():
    boot = ErrorBars(
        ErrorBarMethod.BOOTSTRAP,
        "Gaussian noise σ = 4.2 on each n-gram's noisy total",
        draws=200,
        seed=0xBEEF,
        seed_source="the OS",
        given=("the public prior", "the public local channel (glove)"),
        held=("the empirical-Bayes prior",),
        not_covered=("the prior's bias", "the channel model's error"),
    )
    assert boot.stated and boot.statement() == (
        "Error bars: each n-gram's standard deviation and interval (90% unless another level is asked for) "
        "describe how far the DP noise alone (Gaussian noise σ = 4.2 on each n-gram's noisy total) moves the "
        "released probability from what the same post-processing would give without it, given the public prior "
        "and the public local channel (glove), with the empirical-Bayes prior held as this release fitted them. "
        "The standard deviation is the root-mean-square distance of the probability from the released one over a "
        "parametric bootstrap: 200 redraws of that noise around the released noisy values (DP outputs), each run "
        "through the release's post-processing; generator seed 0xbeef from the OS. The interval is the released "
        "probability ± the normal quantile of the level times the standard deviation, cut to [0, 1]. They do not "
        "cover the prior's bias nor the channel model's error. They are post-processing of the DP outputs and "
        "public data: no further privacy cost."
    )
    laplace = ErrorBars(ErrorBarMethod.CLOSED_FORM, "Laplace noise b = 60", family="laplace", center="c̃/Σc̃")
    assert "closed form" in laplace.statement() and "c̃/Σc̃ ± the laplace quantile" in laplace.statement()
    none = ErrorBars(ErrorBarMethod.NONE, reason="Its noise scale is data-derived.")
    assert not none.stated and none.statement() == "Error bars: none. Its noise scale is data-derived."
    for bars in (boot, laplace, none):  # stored as JSON with the release record, read back the same
        assert ErrorBars.from_dict(json.loads(json.dumps(bars.to_dict()))) == bars
        assert bars.to_dict()["statement"] == bars.statement()


def test_error_bars_validate_what_they_describe():
    with pytest.raises(ValueError, match="at least 2 draws"):
        ErrorBars(ErrorBarMethod.BOOTSTRAP, "noise", draws=1)
    with pytest.raises(ValueError, match="reason is given exactly when"):
        ErrorBars(ErrorBarMethod.NONE)
    with pytest.raises(ValueError, match="reason is given exactly when"):
        ErrorBars(ErrorBarMethod.CLOSED_FORM, "noise", reason="why")
    with pytest.raises(ValueError, match="family"):
        ErrorBars(ErrorBarMethod.CLOSED_FORM, "noise", family="cauchy")
    with pytest.raises(ValueError, match="draws"):
        ErrorBars(ErrorBarMethod.CLOSED_FORM, "noise", draws=-1)
