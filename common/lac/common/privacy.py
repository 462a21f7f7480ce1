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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from numbers import Real

__all__ = [
    "PeriodLoss",
    "Adjacency",
    "Budget",
    "Guarantee",
    "Model",
    "PrivacyUnit",
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
        if self.model is Model.LOCAL:
            return f"{eps:.6g}-local differential privacy (pure, δ = 0) for {unit}, any two inputs ({self.mechanism})."
        where = "of the shuffled batch" if self.model is Model.SHUFFLED else "of the release"
        return (
            f"({eps:.6g}, {delta:.3g})-differential privacy {where} for {unit}, under "
            f"{self.adjacency.value} adjacency ({self.mechanism})."
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
