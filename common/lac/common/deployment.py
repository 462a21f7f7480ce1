"""The deployment's local-privacy configuration: what every accepted report satisfies.

The curator's operator sets it; the curator publishes it (``GetDeployment``), the shuffler
relays it to clients and uses it for its amplification statements, the SDK enforces it before
anything leaves the device, and the curator quarantines reports that exceed it. Because the
report-level ε0 is derived from these fields (ε0 = L·ε·bound), it is never an operator-typed
number that could disagree with what clients do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lac.common.privacy import (
    Adjacency,
    Budget,
    Guarantee,
    Model,
    PeriodLoss,
    PrivacyUnit,
    check_epsilon,
    report_epsilon0,
)

__all__ = [
    "Deployment",
    "epsilon_problem",
    "windows_in_period",
    "LOCAL_MECHANISMS",
    "DEFAULT_EMBEDDING",
    "DEFAULT_EMBEDDING_DIAMETER",
]

# Mechanism names (as the client's mechanisms call themselves) <-> wire ids (LocalMechanism enum).
LOCAL_MECHANISMS = {
    "multivariate-laplace": 1,
    "distance-truncated": 2,
    "knn-truncated": 3,
    "density-modulated": 4,
}
DEFAULT_EMBEDDING = "glove-6b-50d/50000"
# Exact diameter of the default embedding (GloVe 6B 50d, 50,000 most frequent single-token words);
# a test recomputes it from the embedding.
DEFAULT_EMBEDDING_DIAMETER = 18.916230259399217


def windows_in_period(period_seconds: float, window_seconds: float) -> int:
    """How many accounting windows of ``window_seconds`` a period of ``period_seconds`` holds (at least 1: a
    period shorter than a window is one window); period p holds windows p·n .. p·n + n − 1."""
    return max(1, int(period_seconds // window_seconds))


def epsilon_problem(epsilon: float, epsilon_per_word: float, exact: bool) -> str:
    """What is wrong with a report made at ``epsilon`` per word under a deployment of ``epsilon_per_word``
    (``exact``: reports are made at exactly it, else at most): "" (nothing), "too_large" or "not_exact". Equal
    up to a relative 1e-12, for floats that went through text."""
    tol = epsilon_per_word * 1e-12
    if not (math.isfinite(epsilon) and 0 < epsilon <= epsilon_per_word + tol):
        return "too_large"
    return "not_exact" if exact and epsilon < epsilon_per_word - tol else ""


@dataclass(frozen=True)
class Deployment:
    """Local-privacy configuration of one LAC deployment.

    ``word_distance_bound`` bounds the distance term of one word's metric-DP guarantee (the
    embedding's diameter for the multivariate Laplace mechanism), so one word is
    (ε·bound)-LDP and a report of at most ``max_report_words`` words is ε0-LDP with
    ε0 = L·ε·bound. The privacy unit downstream is one client over an accounting window of
    ``window_seconds`` with at most ``reports_per_window`` reports. ``key_ids`` (not privacy
    configuration) are the ids of the HPKE keys the curator opens reports with, its current key first:
    the SDK seals only to one of them (empty: not published, not checked). ``exact_epsilon``: reports are made at
    exactly ``epsilon_per_word``, not at most (a curator that estimates the users' clean text deconvolves with
    the local channel of that one ε, so it takes no report made at another; ``accepts_epsilon``).
    """

    mechanism: str = "multivariate-laplace"
    epsilon_per_word: float = 8.0
    embedding: str = DEFAULT_EMBEDDING
    word_distance_bound: float = DEFAULT_EMBEDDING_DIAMETER
    max_report_words: int = 40
    reports_per_window: int = 1
    window_seconds: float = 86400.0
    key_ids: tuple[str, ...] = ()
    period_seconds: float = 365 * 86400.0
    windows_per_period: int = 0
    exact_epsilon: bool = False

    def __post_init__(self) -> None:
        if self.mechanism not in LOCAL_MECHANISMS:
            raise ValueError(f"unknown local mechanism {self.mechanism!r}; known: {', '.join(LOCAL_MECHANISMS)}")
        check_epsilon(self.epsilon_per_word, "epsilon_per_word")
        check_epsilon(self.word_distance_bound, "word_distance_bound")
        if not self.embedding:
            raise ValueError("embedding must name the deployment's embedding")
        for name in ("max_report_words", "reports_per_window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(f"window_seconds must be finite and > 0, got {self.window_seconds!r}")
        if not (math.isfinite(self.period_seconds) and self.period_seconds > 0):
            raise ValueError(f"period_seconds must be finite and > 0, got {self.period_seconds!r}")
        v = self.windows_per_period
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= self.windows_in_period:
            raise ValueError(f"windows_per_period must be an integer in [0, {self.windows_in_period}], got {v!r}")
        if not all(isinstance(k, str) and k for k in self.key_ids):
            raise ValueError(f"key_ids must be non-empty strings, got {self.key_ids!r}")

    def accepts_epsilon(self, epsilon: float) -> bool:
        """Whether a report made at ``epsilon`` per word is accepted (``epsilon_problem``)."""
        return not epsilon_problem(epsilon, self.epsilon_per_word, self.exact_epsilon)

    def epsilon_rule(self) -> str:
        """The ε per word it accepts, in words ("at most 8", or "exactly 8, ..." with ``exact_epsilon``)."""
        if self.exact_epsilon:
            return (
                f"exactly {self.epsilon_per_word:g}, the ε of the local channel its curator estimates the users' "
                f"clean text with"
            )
        return f"at most {self.epsilon_per_word:g}"

    @property
    def report_epsilon0(self) -> float:
        """Worst-case pure local DP of one report: L·ε·bound (``lac.common.privacy.report_epsilon0``)."""
        return report_epsilon0(self.max_report_words, self.epsilon_per_word, self.word_distance_bound)

    def window(self, unix_time: float) -> int:
        """The accounting window containing ``unix_time``."""
        return int(unix_time // self.window_seconds)

    @property
    def windows_in_period(self) -> int:
        """How many accounting windows one period holds (at least 1)."""
        return windows_in_period(self.period_seconds, self.window_seconds)

    def period(self, window: int) -> int:
        """The period (counted from the Unix epoch) of accounting window ``window``."""
        return window // self.windows_in_period

    def period_loss(self, window_budget: Budget) -> PeriodLoss:
        """What one client can lose over a period, given the curator's budget per window."""
        return PeriodLoss(window_budget, self.windows_in_period, self.window_seconds, self.windows_per_period)

    def word_guarantee(self) -> Guarantee:
        """The metric-DP guarantee of one word under this deployment (ε per word, at most ε·bound-LDP)."""
        return Guarantee(
            Model.METRIC_LOCAL,
            self.epsilon_per_word,
            0.0,
            PrivacyUnit.word(),
            Adjacency.REPLACE,
            f"{self.mechanism} over {self.embedding}",
            details=(
                f"Any two words are at most {self.word_distance_bound:.6g} apart, so one word "
                f"is {self.epsilon_per_word * self.word_distance_bound:.6g}-LDP.",
            ),
        )

    def report_guarantee(self) -> Guarantee:
        """The local guarantee of every accepted report (the ε0 the shuffler amplifies)."""
        L, eps, bound = self.max_report_words, self.epsilon_per_word, self.word_distance_bound
        return Guarantee(
            Model.LOCAL,
            self.report_epsilon0,
            0.0,
            PrivacyUnit.report(L),
            Adjacency.REPLACE_SAME_SHAPE,
            f"{self.mechanism}, ε = {eps:.6g} per word over {self.embedding}",
            details=(
                f"ε0 = L·ε·bound = {L}·{eps:.6g}·{bound:.6g}: at most L words, each perturbed independently "
                f"with ε·d metric DP and d ≤ {bound:.6g}.",
            ),
        )
