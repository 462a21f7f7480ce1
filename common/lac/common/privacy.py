"""LAC's privacy spine: typed budgets and guarantees, and the statements rendered from them.

Every privacy statement LAC prints (a client's per-word guarantee, a report's local level, a
shuffled batch's amplification, a curator release) is ``Guarantee.statement()`` of a frozen
value, so what is printed cannot drift from what is computed:

* ``Budget``: an (ε, δ) pair, validated in one place (``check_epsilon`` / ``check_delta``),
  with basic composition (``+``) and comparison against a limit (``fits``).
* ``PrivacyUnit``: whose data the guarantee protects (a word, one report, or one client over a
  number of accounting windows with at most k reports per window).
* ``Guarantee``: model (metric-local, local, shuffled, central), (ε, δ), unit, adjacency, the
  mechanism, and whether the calibration looked at the data. A data-dependent calibration is
  never differentially private: its statement opens with "NOT differentially private".
* ``ErrorBars``: what a release's per-n-gram error bars describe (the spread the DP noise alone gives
  the released values), how they were computed and what they leave out; never a privacy claim.
* ``LocalGuarantee``: what an export of privatized reports carries (metric DP per word on the
  device, at most L words per report, k reports per client per window, shuffled, the shuffle
  accountant's statement per window as ``WindowShuffle``): local privacy only, no central DP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from numbers import Real
from typing import Any

__all__ = [
    "GuaranteedResult",
    "report_epsilon0",
    "ExportedWindows",
    "ERROR_BAR_LEVEL",
    "ErrorBarMethod",
    "ErrorBars",
    "PeriodLoss",
    "Adjacency",
    "Budget",
    "Guarantee",
    "LocalGuarantee",
    "Model",
    "PrivacyUnit",
    "SAME_SHAPE",
    "VACUOUS_EPSILON",
    "WindowShuffle",
    "check_delta",
    "check_epsilon",
    "DATA_DEPENDENT_PREFIX",
]

DATA_DEPENDENT_PREFIX = "NOT differentially private: data-dependent sensitivity, as in Ramadan et al."
_REL_SLACK = 1e-9  # e.g. ten releases of 0.1 fit a budget of 1.0 despite rounding


def _real(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool), else None."""
    return None if isinstance(value, bool) or not isinstance(value, Real) else float(value)


def check_epsilon(value: object, name: str = "epsilon", allow_zero: bool = False) -> float:
    """``value`` as a float if it is a finite real > 0 (>= 0 with ``allow_zero``), else ValueError."""
    v = _real(value)
    if v is None or not math.isfinite(v) or not (v > 0 or (allow_zero and v == 0)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return v


def check_delta(value: object, name: str = "delta", allow_zero: bool = True) -> float:
    """``value`` as a float if it is in [0, 1) ((0, 1) without ``allow_zero``), else ValueError."""
    v = _real(value)
    if v is None or not (0 <= v < 1) or (v == 0 and not allow_zero):
        bound = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must be in {bound}, got {value!r}")
    return v


@dataclass(frozen=True)
class Budget:
    """An (ε, δ) amount of privacy loss; composes by addition (basic composition)."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_zero=True))
        object.__setattr__(self, "delta", check_delta(self.delta))

    def __add__(self, other: Budget) -> Budget:
        return Budget(self.epsilon + other.epsilon, min(self.delta + other.delta, math.nextafter(1.0, 0.0)))

    def fits(self, limit: Budget) -> bool:
        """True if this amount does not exceed ``limit`` (up to a relative 1e-9 for rounding)."""
        return self.epsilon <= limit.epsilon * (1 + _REL_SLACK) and self.delta <= limit.delta * (1 + _REL_SLACK)

    def minus(self, spent: Budget) -> Budget:
        """What is left of this limit after ``spent`` (never negative)."""
        return Budget(max(self.epsilon - spent.epsilon, 0.0), max(self.delta - spent.delta, 0.0))

    def __str__(self) -> str:
        return f"(ε, δ) = ({self.epsilon:.6g}, {self.delta:.3g})"


class Model(StrEnum):
    """Where the guarantee holds."""

    METRIC_LOCAL = "metric-local"  # ε per unit of distance between two words' embeddings (metric DP)
    LOCAL = "local"  # pure ε-local DP of one report, before it leaves the device
    SHUFFLED = "shuffled"  # central (ε, δ) of one shuffled batch
    CENTRAL = "central"  # central (ε, δ) of a curator release


class Adjacency(StrEnum):
    """Which data sets the guarantee makes indistinguishable."""

    ADD_REMOVE = "add/remove"  # one unit's data present or absent
    REPLACE = "replace"  # one unit's data replaced by any other (metric DP: scaled by their distance)
    # one report replaced by another with as many words and the same sentence boundaries: a report's length and
    # sentence boundaries are visible (reports are not padded), so its local guarantee, and what shuffling
    # amplifies from it, hold only between reports of the same shape
    REPLACE_SAME_SHAPE = "replace-same-shape"

    def describe(self) -> str:
        """The adjacency as a statement says it, e.g. "under add/remove adjacency"."""
        if self is Adjacency.REPLACE_SAME_SHAPE:
            return f"under replace adjacency between inputs with {SAME_SHAPE}"
        return f"under {self.value} adjacency"


SAME_SHAPE = (
    "the same number of words and the same sentence boundaries (a report's length and sentence boundaries are "
    "not hidden)"
)
"""What every report-level and shuffled statement is qualified with (``Adjacency.REPLACE_SAME_SHAPE``)."""


@dataclass(frozen=True)
class PrivacyUnit:
    """Whose data a guarantee protects.

    ``kind`` is "word", "report", "user" (at most ``reports`` reports) or "client" (a client of
    the service over ``windows`` accounting windows of ``window_seconds`` with at most
    ``reports_per_window`` reports each).
    """

    kind: str
    max_words: int | None = None
    reports: int | None = None
    reports_per_window: int | None = None
    windows: int | None = None
    window_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("word", "report", "user", "client"):
            raise ValueError(f"unknown privacy unit {self.kind!r}")
        if self.kind == "user" and not (self.reports and self.reports >= 1):
            raise ValueError("a user unit needs reports >= 1")
        if self.kind == "client" and not (self.reports_per_window and self.windows and self.window_seconds):
            raise ValueError("a client unit needs reports_per_window, windows and window_seconds")

    @classmethod
    def word(cls) -> PrivacyUnit:
        """One word."""
        return cls("word")

    @classmethod
    def report(cls, max_words: int | None = None) -> PrivacyUnit:
        """One report (of at most ``max_words`` words, if given)."""
        return cls("report", max_words=max_words)

    @classmethod
    def user(cls, reports: int) -> PrivacyUnit:
        """All of one user's ``reports`` reports (a single report when ``reports`` is 1)."""
        return cls("user", reports=int(reports)) if reports > 1 else cls("report")

    @classmethod
    def client(cls, reports_per_window: int, windows: int, window_seconds: float) -> PrivacyUnit:
        """One client over ``windows`` accounting windows of ``window_seconds``, ``reports_per_window`` reports each."""
        return cls(
            "client",
            reports_per_window=int(reports_per_window),
            windows=int(windows),
            window_seconds=float(window_seconds),
        )

    @property
    def max_reports(self) -> int:
        """Most reports one unit can contribute (1 for a word or report)."""
        if self.kind == "client" and self.reports_per_window is not None and self.windows is not None:
            return self.reports_per_window * self.windows
        if self.kind == "user" and self.reports is not None:
            return self.reports
        return 1  # a word or a report (__post_init__ ensures the counts of the other kinds)

    def describe(self) -> str:
        """The unit in words, e.g. "one report (at most 40 words)"."""
        if self.kind == "word":
            return "one word"
        if self.kind == "report":
            return "one report" + (f" (at most {self.max_words} words)" if self.max_words else "")
        if self.kind == "user":
            return f"one user's reports (at most {self.reports})"
        per = "report" if self.reports_per_window == 1 else "reports"
        span = "window" if self.windows == 1 else "windows"
        assert self.window_seconds is not None  # __post_init__: a client unit has all three
        return (
            f"one client's contribution over {self.windows} accounting {span} of {_duration(self.window_seconds)} "
            f"(at most {self.reports_per_window} {per} per window, so at most {self.max_reports} in all)"
        )


def _duration(seconds: float) -> str:
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} s"


@dataclass(frozen=True)
class Guarantee:
    """A privacy guarantee; ``statement()`` is the one way LAC prints it.

    ``details`` are sentences the mechanism renders from its own typed parameters (noise
    scale, sensitivity, clamps); ``assumptions`` are what the guarantee relies on outside the
    mechanism (e.g. the shuffler's quota). ``data_dependent`` marks a calibration that looked
    at the data: such a release is never differentially private, whatever its nominal (ε, δ).
    """

    model: Model
    epsilon: float
    delta: float
    unit: PrivacyUnit
    adjacency: Adjacency
    mechanism: str
    data_dependent: bool = False
    details: tuple[str, ...] = field(default=())
    assumptions: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_zero=True))
        object.__setattr__(self, "delta", check_delta(self.delta))
        object.__setattr__(self, "details", tuple(self.details))
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        if self.model in (Model.LOCAL, Model.SHUFFLED) and self.adjacency is not Adjacency.REPLACE_SAME_SHAPE:
            raise ValueError(
                f"a {self.model.value} guarantee of LAC's reports holds only between reports with the same number of "
                f"words and the same sentence boundaries (their length is visible): Adjacency.REPLACE_SAME_SHAPE, "
                f"not {self.adjacency.value}"
            )

    @property
    def budget(self) -> Budget:
        """The (ε, δ) this guarantee spends."""
        return Budget(self.epsilon, self.delta)

    @property
    def differentially_private(self) -> bool:
        """False for a data-dependent statement, which is not a DP guarantee."""
        return not self.data_dependent

    def headline(self) -> str:
        """The claim itself, without the mechanism's details."""
        eps, delta, unit = self.epsilon, self.delta, self.unit.describe()
        if self.data_dependent:
            return (
                f"{DATA_DEPENDENT_PREFIX} {self.mechanism}, nominally ({eps:.6g}, {delta:.3g}) for {unit}: "
                f"the noise was calibrated to a sensitivity computed from the observed data, which is not "
                f"a worst case over all data sets, so no differential-privacy guarantee follows."
            )
        if self.model is Model.METRIC_LOCAL:
            return (
                f"ε·d metric differential privacy for {unit} with ε = {eps:.6g} per unit of distance "
                f"({self.mechanism}): for all words w, w' and every output y, "
                f"Pr[M(w)=y] ≤ exp(ε·d(w,w'))·Pr[M(w')=y]."
            )
        if self.model is Model.LOCAL:  # __post_init__: between reports of the same shape
            return (
                f"{eps:.6g}-local differential privacy (pure, δ = 0) for {unit}: any two inputs with {SAME_SHAPE} "
                f"({self.mechanism})."
            )
        where = "of the shuffled batch" if self.model is Model.SHUFFLED else "of the release"
        return (
            f"({eps:.6g}, {delta:.3g})-differential privacy {where} for {unit}, {self.adjacency.describe()} "
            f"({self.mechanism})."
        )

    def statement(self) -> str:
        """Headline, then the mechanism's details, then the assumptions."""
        parts = [self.headline(), *self.details]
        if self.assumptions:
            parts.append("Assumes " + "; ".join(self.assumptions) + ".")
        return " ".join(parts)

    def public_statement(self) -> str:
        """The statement for people who may not see data-derived numbers: a data-dependent
        guarantee's details (its sensitivity and noise scale are functions of the data) are left out."""
        if not self.data_dependent:
            return self.statement()
        return (
            f"{self.headline()} Its sensitivity and noise scale are computed from the data and are shown to "
            f"operators only."
        )


class GuaranteedResult:
    """What a result with an optional ``guarantee`` (None: it has none, e.g. k-anonymity) and a ``note`` (its
    statement when it has none) says of itself; mixed into the release types."""

    guarantee: Guarantee | None
    note: str

    @property
    def differentially_private(self) -> bool:
        """True when the result carries a (data-independent) DP guarantee."""
        return self.guarantee is not None and self.guarantee.differentially_private

    @property
    def statement(self) -> str:
        """The guarantee in words, or the note of a result without one."""
        return self.guarantee.statement() if self.guarantee is not None else self.note


@dataclass(frozen=True)
class PeriodLoss:
    """The privacy loss of one client over a period of ``windows`` accounting windows, by basic composition
    of the curator's per-window budget: every window it contributes to may be spent up to ``window_budget``.
    ``cap`` (0: none) is the most windows of one period a client may contribute to (the shuffler's limit)."""

    window_budget: Budget
    windows: int
    window_seconds: float
    cap: int = 0

    @property
    def bound(self) -> Budget:
        """The loss over one period (periods counted from the Unix epoch): cap (or every window) × the budget."""
        k = self.cap or self.windows
        return Budget(k * self.window_budget.epsilon, min(k * self.window_budget.delta, 1.0 - 1e-16))

    def statement(self) -> str:
        """The bound in words, with how it follows and what a cap would change."""
        b, k, T = self.window_budget, self.cap, self.windows
        period = f"a period of {_duration(T * self.window_seconds)} ({T} accounting windows, from the Unix epoch)"
        total = f"(ε = {self.bound.epsilon:.6g}, δ = {self.bound.delta:.3g})"
        if k:
            return (
                f"Over time: over {period} one client contributes to at most {k} windows (enforced by the shuffler "
                f"for authenticated clients), so its total privacy loss over a period is at most {k} × the per-window "
                f"budget (ε = {b.epsilon:.6g}, δ = {b.delta:.3g}) = {total} by basic composition; any stretch of "
                f"that length overlaps two periods, so at most twice that."
            )
        return (
            f"Over time: no cap on windows per client is set, so a client active in every window of {period} "
            f"can lose up to {T} × the per-window budget (ε = {b.epsilon:.6g}, δ = {b.delta:.3g}) = {total} by "
            f"basic composition over it; the operator can cap windows per client per period."
        )


@dataclass(frozen=True)
class ExportedWindows:
    """Accounting windows of a central release (or of a budget view) whose privatized reports were also exported:
    ``windows`` of them, between ``first`` and ``last``, by ``exports`` export(s) (0: not counted), ``later``
    when the exports came after the release. An export gives its holder the reports themselves under their local
    guarantee only (``LocalGuarantee``); a central release over the same windows adds at most its (ε, δ) to that
    by composition, and its (ε, δ), the ledger's budget and the bound over a period count central releases only.
    ``caveat`` and ``budget_note`` say so; every statement over exported windows carries one of them."""

    windows: int
    first: int
    last: int
    exports: int = 0
    later: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.windows <= self.last - self.first + 1:
            raise ValueError(f"windows must be in [1, {self.last - self.first + 1}], got {self.windows!r}")
        if self.exports < 0:
            raise ValueError(f"exports must be >= 0, got {self.exports!r}")

    @classmethod
    def of(cls, windows: Iterable[int], exports: int = 0, later: bool = False) -> ExportedWindows | None:
        """The exported windows among ``windows`` (None: none)."""
        ws = sorted(set(windows))
        return cls(len(ws), ws[0], ws[-1], exports, later) if ws else None

    def _span(self) -> str:
        span = f"window {self.first}" if self.first == self.last else f"windows {self.first}..{self.last}"
        whole = self.windows == self.last - self.first + 1
        return span if whole else f"{self.windows} of {span}"

    def caveat(self) -> str:
        """What a central release's statement adds: how it composes with the exports of its windows."""
        when = "were later also exported" if self.later else "were also exported"
        n = f" ({self.exports} export{'s' if self.exports != 1 else ''})" if self.exports else ""
        return (
            f"Composition with exports: the privatized reports of {self._span()} {when}{n}, with local differential "
            f"privacy only (see the export's statement). Against anyone who holds such an export, those windows' "
            f"clients are protected by its local guarantee (per-word metric DP), to which this release adds at most "
            f"its (ε, δ) by composition; this release's (ε, δ), the ledger's per-window budget and the bound over a "
            f"period count central releases only, not what the exports disclosed."
        )

    def budget_note(self) -> str:
        """What a budget view adds about its exported windows."""
        return (
            f"The privatized reports of {self._span()} were exported (local differential privacy only): there the "
            f"remaining budget bounds further central releases only; against whoever holds an export, those windows' "
            f"clients are protected by its local guarantee, with which every central release over them composes."
        )


ERROR_BAR_LEVEL = 0.9
"""The default coverage of a release's per-n-gram intervals (an analyst may ask for another level)."""


class ErrorBarMethod(StrEnum):
    """How a release's error bars were computed."""

    BOOTSTRAP = "bootstrap"  # redraws of the DP noise around the released noisy values, through the post-processing
    CLOSED_FORM = "closed form"  # from the noise's scale (Laplace)
    NONE = "none"  # no error bars (``ErrorBars.reason`` says why)


@dataclass(frozen=True)
class ErrorBars:
    """What a release's per-n-gram error bars (a standard deviation and an interval) describe.

    They are the spread of each released value due to the DP noise alone (``noise``, rendered by the
    mechanism from its typed scale), given the public inputs in ``given``, with the fitted choices in
    ``held`` kept as the release made them; computed by ``method`` from the DP outputs and public data
    only (post-processing, no privacy cost). ``draws``, ``seed`` and ``seed_source``: the bootstrap's
    redraws, the seed of its generator and where that came from (the OS, or the caller). An interval is
    ``center`` ± the ``family`` ("normal" or "laplace") quantile of its level times the standard deviation.
    ``not_covered``: errors they leave out. ``reason``: why a release has none (method ``NONE``).
    ``statement()`` is the one way they are described.
    """

    method: ErrorBarMethod
    noise: str = ""
    draws: int = 0
    seed: int | None = None
    seed_source: str = ""
    given: tuple[str, ...] = field(default=())
    held: tuple[str, ...] = field(default=())
    not_covered: tuple[str, ...] = field(default=())
    family: str = "normal"
    center: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", ErrorBarMethod(self.method))
        for name in ("given", "held", "not_covered"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 0:
            raise ValueError(f"draws must be an integer >= 0, got {self.draws!r}")
        if self.method is ErrorBarMethod.BOOTSTRAP and self.draws < 2:
            raise ValueError("a bootstrap needs at least 2 draws")
        if (self.method is ErrorBarMethod.NONE) != bool(self.reason):
            raise ValueError("a reason is given exactly when there are no error bars")
        if self.family not in ("normal", "laplace"):
            raise ValueError(f"family must be 'normal' or 'laplace', got {self.family!r}")

    @property
    def stated(self) -> bool:
        """Whether the release has error bars."""
        return self.method is not ErrorBarMethod.NONE

    def statement(self) -> str:
        """What the error bars cover, how they were computed and what they leave out, in words."""
        if not self.stated:
            return f"Error bars: none. {self.reason}"
        given = f", given {' and '.join(self.given)}" if self.given else ""
        held = f", with {' and '.join(self.held)} held as this release fitted them" if self.held else ""
        parts = [
            f"Error bars: each n-gram's standard deviation and interval ({ERROR_BAR_LEVEL:.0%} unless another "
            f"level is asked for) describe how far the DP noise alone ({self.noise}) moves the released "
            f"probability from what the same post-processing would give without it{given}{held}."
        ]
        if self.method is ErrorBarMethod.BOOTSTRAP:
            seed = (
                f"; generator seed {self.seed:#x} from {self.seed_source or 'the OS'}" if self.seed is not None else ""
            )
            parts.append(
                f"The standard deviation is the root-mean-square distance of the probability from the released one "
                f"over a parametric bootstrap: {self.draws} redraws of that noise around the released noisy values "
                f"(DP outputs), each run through the release's post-processing{seed}."
            )
        else:
            parts.append("The standard deviation follows from the noise's distribution (closed form).")
        parts.append(
            f"The interval is {self.center or 'the released probability'} ± the {self.family} quantile of the "
            f"level times the standard deviation, cut to [0, 1]."
        )
        if self.not_covered:
            parts.append(f"They do not cover {' nor '.join(self.not_covered)}.")
        parts.append("They are post-processing of the DP outputs and public data: no further privacy cost.")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The description as a plain dict as JSON gives it back (lists, not tuples), with its statement."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        d["method"] = self.method.value
        d["statement"] = self.statement()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ErrorBars:
        """The inverse of ``to_dict`` (its statement is rendered again, not read)."""
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k != "statement"}
        return cls(**fields)


VACUOUS_EPSILON = 10.0
"""A pure ε-DP bound at or above this rules out nothing in practice: from even odds, an attacker's belief
about any yes/no question may move to e^ε / (1 + e^ε) ≥ 0.99995. Statements call such a bound vacuous."""


def _posterior(epsilon: float) -> str:
    """The largest belief an ε-DP bound allows from even odds, as printed."""
    p = 1.0 / (1.0 + math.exp(-min(epsilon, 700.0)))
    return "1 (to printed precision)" if p > 1 - 1e-9 else f"{p:.6g}"


@dataclass(frozen=True)
class WindowShuffle:
    """The shuffle accountant's statements for the reports of one accounting window, as the shuffler
    computed them per batch (``lac.shuffler.amplification``) and the curator stored them with each batch.

    ``epsilon`` and ``delta`` are those of the weakest batch (the largest ε: for the default accountant the
    smallest batch, ``smallest_batch`` reports); ``amplified`` is True when every batch's ε is below the
    report-level ε0; ``unverified`` batches carried no statement, or one computed for a smaller ε0 than the
    deployment's, so nothing is claimed for them beyond the local guarantee."""

    window: int
    batches: int
    reports: int
    smallest_batch: int
    epsilon: float
    delta: float
    amplified: bool
    method: str
    unverified: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_zero=True))
        object.__setattr__(self, "delta", check_delta(self.delta))
        for name in ("batches", "reports", "smallest_batch", "unverified"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")

    def describe(self, epsilon0: float) -> str:
        """The window's amplification in one sentence, against the report-level ``epsilon0``."""
        batches = f"{self.batches} batch{'es' if self.batches != 1 else ''} of {self.reports} reports"
        if self.amplified and not self.unverified:
            verdict = (
                f"shuffling amplifies ε0 to ({self.epsilon:.6g}, {self.delta:.3g})-DP per batch of distinct clients "
                f"{Adjacency.REPLACE_SAME_SHAPE.describe()} (the weakest batch, {self.smallest_batch} reports; "
                f"method {self.method})"
            )
            if self.epsilon >= VACUOUS_EPSILON:
                verdict += f", itself vacuous (ε ≥ {VACUOUS_EPSILON:g})"
        else:
            why = f"{self.unverified} without a verifiable statement" if self.unverified else "none amplified"
            verdict = (
                f"no amplification ({why}; smallest batch {self.smallest_batch} reports): only the local "
                f"ε0 = {epsilon0:.6g} holds"
            )
        return f"window {self.window}: {batches}, {verdict}"


def report_epsilon0(max_report_words: int, epsilon_per_word: float, word_distance_bound: float) -> float:
    """Worst-case pure local DP of one report of at most L = ``max_report_words`` words, each perturbed with metric
    DP at ``epsilon_per_word`` over an embedding whose words are at most ``word_distance_bound`` apart: L·ε·bound."""
    return max_report_words * epsilon_per_word * word_distance_bound


@dataclass(frozen=True)
class LocalGuarantee:
    """The guarantee of exported privatized reports: what they are, never more.

    Each row is one report as a device sent it (per-word metric DP with ``epsilon_per_word`` over the
    deployment's embedding, at most ``max_report_words`` words), at most ``reports_per_window`` reports per
    client per accounting window, from windows ``first_window``..``last_window``, in a fresh uniformly random
    order with no batch, time or client attached; ``shuffles`` are the shuffle accountant's statements per
    window. No noise was added at the curator: this is local differential privacy, not a central release,
    and nothing is charged to the central budget. ``statement()`` is the one way it is printed.
    """

    mechanism: str
    epsilon_per_word: float
    embedding: str
    word_distance_bound: float
    max_report_words: int
    reports_per_window: int
    window_seconds: float
    first_window: int
    last_window: int
    rows: int
    shuffles: tuple[WindowShuffle, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon_per_word", check_epsilon(self.epsilon_per_word, "epsilon_per_word"))
        object.__setattr__(self, "word_distance_bound", check_epsilon(self.word_distance_bound, "word_distance_bound"))
        object.__setattr__(self, "shuffles", tuple(self.shuffles))
        for name in ("max_report_words", "reports_per_window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(f"window_seconds must be finite and > 0, got {self.window_seconds!r}")
        if not 0 <= self.first_window <= self.last_window:
            raise ValueError(f"windows must satisfy 0 <= first <= last, got {self.first_window}..{self.last_window}")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0:
            raise ValueError(f"rows must be an integer >= 0, got {self.rows!r}")

    @property
    def windows(self) -> int:
        """The number of accounting windows exported."""
        return self.last_window - self.first_window + 1

    @property
    def report_epsilon0(self) -> float:
        """Worst-case pure local DP of one report (``report_epsilon0``)."""
        return report_epsilon0(self.max_report_words, self.epsilon_per_word, self.word_distance_bound)

    @property
    def vacuous(self) -> bool:
        """Whether the report-level bound ε0 rules out nothing in practice (ε0 ≥ ``VACUOUS_EPSILON``)."""
        return self.report_epsilon0 >= VACUOUS_EPSILON

    @property
    def amplified(self) -> bool:
        """Whether the accountant found amplification in every exported window (with a statement for every batch)."""
        return bool(self.shuffles) and all(s.amplified and not s.unverified for s in self.shuffles)

    def word_guarantee(self) -> Guarantee:
        """The per-word metric-DP guarantee every exported word carries."""
        return Guarantee(
            Model.METRIC_LOCAL,
            self.epsilon_per_word,
            0.0,
            PrivacyUnit.word(),
            Adjacency.REPLACE,
            f"{self.mechanism} over {self.embedding}",
        )

    def report_guarantee(self) -> Guarantee:
        """The report-level ε0-LDP guarantee (between reports of the same shape) every exported row carries."""
        return Guarantee(
            Model.LOCAL,
            self.report_epsilon0,
            0.0,
            PrivacyUnit.report(self.max_report_words),
            Adjacency.REPLACE_SAME_SHAPE,
            f"{self.mechanism}, ε = {self.epsilon_per_word:.6g} per word over {self.embedding}",
        )

    def statement(self) -> str:
        """The export's guarantee in words: local only, per word, per report, per client, the shuffle, no central DP."""
        L, eps, bound, eps0 = (
            self.max_report_words,
            self.epsilon_per_word,
            self.word_distance_bound,
            self.report_epsilon0,
        )
        k, T = self.reports_per_window, self.windows
        span = f"window {self.first_window}" if T == 1 else f"windows {self.first_window}..{self.last_window}"
        parts = [
            f"Exported privatized reports of accounting {span} ({self.rows} rows): local differential privacy "
            f"only. NOT a central differential-privacy release: the curator added no noise and charged nothing to "
            f"the central budget; each row is one report's words as its device perturbed them.",
            f"Per word: {self.word_guarantee().headline()}",
            f"Per report: at most {L} words, each perturbed independently, so ε0 = L·ε·bound = "
            f"{L}·{eps:.6g}·{bound:.6g} = {eps0:.6g}: {self.report_guarantee().headline()}",
        ]
        if self.vacuous:
            parts.append(
                f"That report-level bound is vacuous (ε0 ≥ {VACUOUS_EPSILON:g}: from even odds an attacker's belief "
                f"about anything in a report may reach {_posterior(eps0)}): what protects a report is the per-word "
                f"metric guarantee, which hides a word among words near it in the embedding, not the whole text."
            )
        per = "report" if k == 1 else "reports"
        parts.append(
            f"Per client: at most {k} {per} per accounting window of {_duration(self.window_seconds)} (the "
            f"shuffler's quota), so one client is the source of at most {k * T} of these rows. Rows carry no "
            f"batch, time, order, position or client and come in a fresh uniformly random order, but their words "
            f"can still link rows of one writer (style, repeated rare words)."
        )
        if self.shuffles:
            shown = [s.describe(eps0) for s in self.shuffles[:5]]
            more = len(self.shuffles) - len(shown)
            if more:
                rest = self.shuffles[5:]
                n_amp = sum(s.amplified and not s.unverified for s in rest)
                shown.append(f"and {more} more window{'s' if more != 1 else ''} ({n_amp} of them amplified)")
            parts.append("Shuffle accountant (the shuffler's, per batch): " + "; ".join(shown) + ".")
        else:
            parts.append("Shuffle accountant: no statement (no batch in these windows carried one).")
        if not any(s.amplified and not s.unverified for s in self.shuffles):
            parts.append("Shuffling adds nothing provable here: the local guarantees above are all that holds.")
        elif not self.amplified:
            parts.append("In the windows without amplification only the local guarantees above hold.")
        if k > 1:
            parts.append(f"A client's {k} reports in one window compose: {k}× the per-report and per-word losses.")
        parts.append(
            "Central releases over these windows compose with it: to the holder of this export each adds at most "
            "its (ε, δ) to the local guarantee above (the curator's budget view lists both; their statements say so)."
        )
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The guarantee as a plain dict (JSON-able), with its statement."""
        d = asdict(self)
        d["report_epsilon0"] = self.report_epsilon0
        d["vacuous"] = self.vacuous
        d["statement"] = self.statement()
        return d
