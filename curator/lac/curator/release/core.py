"""One release, from a request to a guarantee: the only home of release defaults.

* ``ReleaseSpec``: what an analyst asks for (mechanism, ε, δ, knobs, windows). Its defaults
  are the release defaults of the gRPC service, the CLI and the offline path.
* ``PublicCaps``: what the curator's configuration fixes (W, C, the clip M, the EndToEndDP
  validation cap); never part of a request, so an analyst cannot tune a sensitivity to the data.
* ``Reports``: where the reports come from: ``StoredReports`` (the curator's segments, read one at a
  time), ``ItemReports`` (in memory) or ``MatrixReports`` (an offline counts matrix over the
  vocabulary). Mechanisms over the public vocabulary read its per-report counts; the default
  mechanism (``lac.curator.release.posterior``) reads every n-gram of every report.
* ``run``: reports + public vocabulary + spec + caps + privacy unit -> ``Release`` (the released
  items, log-probabilities and pseudo-counts, and the typed ``Guarantee`` its statement is
  rendered from).

Data-dependent sensitivities (the papers' "bruteforce", "claim1", laplace-public "observed")
and k-anonymity are never differentially private: their releases carry that label and callers
must not charge them to a privacy budget (``Release.charge`` is None).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from numbers import Real
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from lac.common.privacy import Budget, Guarantee, PeriodLoss, PrivacyUnit, check_delta, check_epsilon
from lac.common.rng import RandomSource
from lac.curator import mechanisms
from lac.curator.release.baselines import BaselineRelease
from lac.curator.release.bayesian import (
    LOG_THETA_GRID,
    SENSITIVITY_METHODS,
    CountStats,
    bruteforce_sq_dists,
    count_stats,
)
from lac.curator.release.channel import NgramChannel
from lac.curator.release.engine import LOCAL, Engine
from lac.curator.release.gaussian import METHODS as CALIBRATIONS
from lac.curator.release.ngrams import NgramVocabulary, ReportItems, cap_and_clamp
from lac.curator.release.posterior import WeightedTotals, weighted_totals
from lac.curator.store import segments

__all__ = [
    "ReleaseSpec",
    "PublicCaps",
    "Release",
    "ReleaseRecord",
    "run",
    "Reports",
    "StoredReports",
    "ItemReports",
    "MatrixReports",
    "vocab_counts",
]


@dataclass(frozen=True)
class PublicCaps:
    """The public caps every sensitivity is computed from (curator configuration)."""

    W: int = 100  # items per report
    C: int = 3  # per-report, per-item clamp
    count_clip: int = 1_000_000  # item totals clipped here before BayesianDP's log
    validation_cap: int = 100_000  # EndToEndDP validation split (sound)

    def __post_init__(self) -> None:
        for name in ("W", "C", "count_clip", "validation_cap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class ReleaseSpec:
    """One release request. Defaults here are the release defaults everywhere."""

    epsilon: float
    delta: float = 1e-6
    mechanism: str = "posterior"
    sensitivity: str = "sound"
    S: float = 0.01
    rho: float = 0.5
    calibration: str = "auto"
    public_sensitivity: str = "sound"
    first_window: int | None = None
    last_window: int | None = None
    K: int = 50  # k-anonymity threshold (offline only)
    discovery: bool = True  # posterior: DP discovery of n-grams outside the public vocabulary
    force: bool = False  # release even if the accuracy check predicts the noise would swamp the signal
    expected_reports: int | None = (
        None  # the number of reports the accuracy check assumes (lac.curator.release.preview)
    )

    def __post_init__(self) -> None:
        if self.expected_reports is not None and (
            isinstance(self.expected_reports, bool)
            or not isinstance(self.expected_reports, int)
            or self.expected_reports < 1
        ):
            raise ValueError(f"expected_reports must be an integer >= 1, got {self.expected_reports!r}")
        if self.mechanism not in mechanisms.REGISTRY:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; available: {', '.join(mechanisms.over_rpc())}")
        m = mechanisms.get(self.mechanism)
        if m.takes_epsilon:
            check_epsilon(self.epsilon)
        if m.with_delta:
            check_delta(self.delta, allow_zero=False)
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise ValueError(f"unknown sensitivity {self.sensitivity!r}; available: {', '.join(SENSITIVITY_METHODS)}")
        if self.public_sensitivity not in ("sound", "observed"):
            raise ValueError(f"unknown public_sensitivity {self.public_sensitivity!r}; available: sound, observed")
        if self.sensitivity != "sound" and "sensitivity" not in m.knobs:
            raise ValueError(
                f"sensitivity {self.sensitivity!r} applies to {' and '.join(mechanisms.with_knob('sensitivity'))} only"
            )
        if self.public_sensitivity != "sound" and "public_sensitivity" not in m.knobs:
            raise ValueError(
                f"public_sensitivity {self.public_sensitivity!r} applies to "
                f"{' and '.join(mechanisms.with_knob('public_sensitivity'))} only"
            )
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {self.calibration!r}; available: {', '.join(CALIBRATIONS)}")
        if isinstance(self.S, bool) or not (isinstance(self.S, Real) and math.isfinite(self.S) and self.S > 0):
            raise ValueError(f"S must be a finite number > 0, got {self.S!r}")
        if isinstance(self.rho, bool) or not (isinstance(self.rho, Real) and 0 < self.rho <= 1):
            raise ValueError(f"rho must be in (0, 1], got {self.rho!r}")
        if (self.first_window is None) != (self.last_window is None):
            raise ValueError("give both first_window and last_window, or neither")
        if self.first_window is not None and self.first_window > self.last_window:
            raise ValueError("first_window must not be after last_window")
        m.validate(self)

    @property
    def data_dependent(self) -> bool:
        """True when the requested calibration looks at the data (NOT differentially private)."""
        return mechanisms.get(self.mechanism).data_dependent(self)

    @property
    def budget(self) -> Budget:
        """The (ε, δ) this release spends from each window it covers when it is DP."""
        return mechanisms.get(self.mechanism).charge(self)


class Reports(Protocol):
    """Where a release reads its reports from (one row per report)."""

    def blocks(self) -> Iterator[ReportItems]:
        """Every n-gram of every report, words read against the vocabulary's word list, block by block."""

    def parts(self) -> Sequence:
        """Picklable handles of the blocks, in order (``load`` turns one into its block)."""

    def load(self, part) -> ReportItems:
        """The block of one part."""

    def vocab_counts(self, C: int, W: int) -> sp.csr_matrix:
        """Per-report counts over the vocabulary: each report's first W vocabulary items, clamped at C."""


def vocab_counts(blocks: Iterator[ReportItems], vocab: NgramVocabulary, C: int, W: int) -> sp.csr_matrix:
    """Stack the blocks' counts over the vocabulary's columns (items outside it are dropped before W)."""
    parts = []
    for b in blocks:
        to_col = vocab.columns(b.items)
        cols = to_col[b.item_ids] if b.item_ids.size else np.empty(0, np.int64)
        parts.append(cap_and_clamp(b.indptr, cols, b.counts, len(vocab), C, W))
    if not parts:
        return sp.csr_matrix((0, len(vocab)), dtype=np.int32)
    out = sp.vstack(parts, format="csr")
    out.indices = out.indices.astype(np.int32, copy=False)
    return out


@dataclass(frozen=True)
class StoredReports:
    """The curator's segments (``lac.curator.store.segments``), read one file at a time."""

    paths: Sequence[Path]
    vocab: NgramVocabulary

    def blocks(self) -> Iterator[ReportItems]:
        return segments.read_blocks(list(self.paths), self.vocab)

    def parts(self) -> list[Path]:
        """One part per segment file (what an engine distributes)."""
        return list(self.paths)

    def load(self, part: Path) -> ReportItems:
        return next(segments.read_blocks([part], self.vocab))

    def vocab_counts(self, C: int, W: int) -> sp.csr_matrix:
        return vocab_counts(self.blocks(), self.vocab, C, W)


@dataclass(frozen=True)
class ItemReports:
    """Reports already extracted in memory (``lac.curator.release.ngrams.report_items`` with the vocabulary's words)."""

    items: Sequence[ReportItems]
    vocab: NgramVocabulary

    def blocks(self) -> Iterator[ReportItems]:
        return iter(self.items)

    def parts(self) -> list[int]:
        return list(range(len(self.items)))

    def load(self, part: int) -> ReportItems:
        return self.items[part]

    def vocab_counts(self, C: int, W: int) -> sp.csr_matrix:
        return vocab_counts(self.blocks(), self.vocab, C, W)


@dataclass(frozen=True)
class MatrixReports:
    """An offline per-report counts matrix over the vocabulary's columns (no n-gram outside it)."""

    U: sp.csr_matrix
    vocab: NgramVocabulary

    def blocks(self) -> Iterator[ReportItems]:
        yield self.load(0)

    def parts(self) -> list[int]:
        return [0]

    def load(self, part: int) -> ReportItems:
        U = sp.csr_matrix(self.U)
        return ReportItems(
            U.indptr.astype(np.int64), U.indices.astype(np.int32), U.data.astype(np.int32), tuple(self.vocab.items)
        )

    def vocab_counts(self, C: int, W: int) -> sp.csr_matrix:
        return self.U


@dataclass(frozen=True, eq=False)
class Release:
    """A computed release: what is published (items, log-probabilities, pseudo-counts) and what it guarantees."""

    mechanism: str
    items: tuple[str, ...]
    log_probs: np.ndarray
    pseudo_counts: np.ndarray | None  # the posterior mechanism's counts (None: a distribution only)
    guarantee: Guarantee | None  # None: k-anonymity (no guarantee at all)
    note: str
    sensitivity_method: str
    gamma: float
    sigma: float
    calibration: str
    laplace_scale: float
    n_reports: int  # exact: library/operator only
    vocab_size: int
    params: dict[str, float] = field(default_factory=dict)  # public knobs and caps
    threshold: float = 0.0  # the discovery threshold (posterior)
    discovered: int = 0  # n-grams released by discovery (a DP output)
    channel: str = ""  # the deployment whose public local channel estimated the clean statistics ("": none)

    @property
    def differentially_private(self) -> bool:
        return self.guarantee is not None and self.guarantee.differentially_private

    @property
    def statement(self) -> str:
        return self.guarantee.statement() if self.guarantee is not None else self.note

    @property
    def charge(self) -> Budget | None:
        """What this release spends from each window it covers (None: not DP, never charged)."""
        g = self.guarantee
        return g.budget if g is not None and g.differentially_private else None


def rounded(log_probs: np.ndarray) -> np.ndarray:
    """Log-probabilities on multiples of 2⁻⁴⁰ (a floating-point mitigation, not a proof)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    finite = np.isfinite(lp)
    return np.where(finite, np.rint(np.where(finite, lp, 0.0) / LOG_THETA_GRID) * LOG_THETA_GRID, lp)


def block_totals(
    block: ReportItems, vocab: NgramVocabulary, W: int, C: int, tau: float, candidates: bool
) -> WeightedTotals:
    """The posterior's weighted totals of one block (an engine's map step)."""
    return weighted_totals([block], vocab, W, C, tau, candidates=candidates)


def block_stats(block: ReportItems, vocab: NgramVocabulary, C: int, W: int) -> CountStats:
    """Column totals of one block's counts over the vocabulary (first W items, clamped at C)."""
    return count_stats(vocab_counts(iter([block]), vocab, C, W), C)


def block_max_sq_dist(block: ReportItems, vocab: NgramVocabulary, C: int, W: int, stats: CountStats, S: float) -> float:
    """The largest brute-force squared distance of one block's reports, given the global totals."""
    sq = bruteforce_sq_dists(vocab_counts(iter([block]), vocab, C, W), stats, S, C)
    return float(sq.max()) if sq.size else 0.0


def add_totals(acc: WeightedTotals, part: WeightedTotals) -> WeightedTotals:
    acc += part
    return acc


def max_of(acc: float, part: float) -> float:
    return max(acc, part)


def _add_stats(acc: CountStats | None, part: CountStats) -> CountStats:
    return part if acc is None else acc + part


def stream_stats(reports: Reports, vocab: NgramVocabulary, C: int, W: int, engine: Engine) -> CountStats:
    stats = engine.fold(reports, partial(block_stats, vocab=vocab, C=C, W=W), _add_stats, None)
    if stats is None:  # no block at all
        stats = CountStats(np.zeros(len(vocab)), np.zeros(len(vocab), dtype=np.int64), 0, C)
    return stats


def run(
    reports: Reports | sp.csr_matrix,
    vocab: NgramVocabulary,
    spec: ReleaseSpec,
    caps: PublicCaps,
    unit: PrivacyUnit = PrivacyUnit.report(),
    rng: RandomSource | None = None,
    engine: Engine = LOCAL,
    channel: NgramChannel | None = None,
) -> Release:
    """Run ``spec`` on ``reports`` (a ``Reports`` source, or a per-report counts matrix over ``vocab``).

    The mechanism (``lac.curator.mechanisms``) runs it: stored and in-memory reports are streamed
    through ``engine`` (``lac.curator.release.engine``): every mechanism but EndToEndDP and k-anonymity
    reads them block by block; an offline matrix is used as given. With the deployment's local
    ``channel``, the default mechanism estimates the users' clean statistics (post-processing,
    ``lac.curator.release.posterior.clean_estimate``)."""
    if sp.issparse(reports):
        reports = MatrixReports(sp.csr_matrix(reports), vocab)
    return mechanisms.get(spec.mechanism).run(reports, vocab, spec, caps, unit, rng, engine, channel)


def counted_baseline(
    reports: Reports,
    vocab: NgramVocabulary,
    spec: ReleaseSpec,
    caps: PublicCaps,
    engine: Engine,
    from_stats: Callable[[CountStats], BaselineRelease],
    from_counts: Callable[[sp.csr_matrix], BaselineRelease],
) -> Release:
    """A baseline over the vocabulary's per-report counts (first W items, clamped at C): from column totals
    streamed block by block through ``engine``, or from an offline counts matrix as given."""
    items = tuple(vocab.items)
    if not isinstance(reports, MatrixReports):
        stats = stream_stats(reports, vocab, caps.C, caps.W, engine)
        return baseline_release(spec, items, from_stats(stats), dict(vocab_size=len(items), n_reports=stats.n_users))
    U = reports.vocab_counts(caps.C, caps.W)
    return baseline_release(spec, items, from_counts(U), dict(vocab_size=len(items), n_reports=int(U.shape[0])))


def baseline_release(spec: ReleaseSpec, items: tuple[str, ...], b: BaselineRelease, common: dict[str, Any]) -> Release:
    """The release of a baseline (``lac.curator.release.baselines``): its probabilities as rounded log-probabilities."""
    with np.errstate(divide="ignore"):
        log_probs = np.log(b.probs)
    return Release(
        spec.mechanism,
        items,
        rounded(log_probs),
        None,
        b.guarantee,
        b.note,
        b.sensitivity_method,
        0.0,
        0.0,
        "",
        b.scale,
        params={k: float(v) for k, v in b.params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        **common,
    )


def _data_dependent_caveat(n: int) -> str:
    """What a DP release's statement adds when its windows had ``n`` data-dependent releases before it."""
    if not n:
        return ""
    return (
        f" Caveat: the data of its windows also fed up to {n} data-dependent release(s) (NOT differentially "
        f"private, enabled by the operator), so the privacy loss of those windows' clients is not bounded by "
        f"the ledger's ε and δ alone."
    )


@dataclass(frozen=True)
class ReleaseRecord:
    """What the curator remembers of a release (stored as JSON; ``lac.curator.service.serde`` renders the
    analyst's and the operator's views of it)."""

    release_id: str
    created_at: str
    mechanism: str
    params: dict[str, float]
    sensitivity_method: str
    data_dependent: bool
    differentially_private: bool
    gamma: float
    sigma: float
    calibration: str
    laplace_scale: float
    epsilon: float
    delta: float
    charged_epsilon: float  # spent from each covered window (0 when not DP)
    charged_delta: float
    n_reports: int  # exact: operator only
    vocab_size: int
    max_n: int
    first_window: int
    last_window: int
    privacy_unit: str
    reports_per_user: int
    statement: str  # the full statement (operator)
    public_statement: str  # the statement without data-derived numbers (analyst)
    threshold: float = 0.0  # the discovery threshold ρ (posterior)
    discovered: int = 0  # n-grams released by DP discovery
    request_id: str = ""  # the client's id of the request that made it (idempotent retries)
    channel: str = ""  # the deployment whose local channel estimated the users' clean text ("": the perturbed text)
    data_dependent_before: int = 0  # data-dependent (NOT DP) releases that had covered one of its windows before it

    @classmethod
    def of(
        cls,
        release: Release,
        release_id: str,
        created_at: str,
        max_n: int,
        windows: tuple[int, int],
        unit: PrivacyUnit,
        request_id: str = "",
        data_dependent_before: int = 0,
        period: PeriodLoss | None = None,
    ) -> ReleaseRecord:
        """The record of ``release``; ``data_dependent_before``: the most data-dependent releases any of
        its windows had before it (a DP release's statements then say its guarantee is not the whole story);
        ``period``: one client's loss over a period, which its statements end with."""
        g = release.guarantee
        charge = release.charge
        caveat = _data_dependent_caveat(data_dependent_before) if release.differentially_private else ""
        if period is not None:
            caveat += " " + period.statement()
        return cls(
            release_id=release_id,
            created_at=created_at,
            mechanism=release.mechanism,
            params=dict(release.params),
            sensitivity_method=release.sensitivity_method,
            data_dependent=g is None or g.data_dependent,
            differentially_private=release.differentially_private,
            gamma=release.gamma,
            sigma=release.sigma,
            calibration=release.calibration,
            laplace_scale=release.laplace_scale,
            epsilon=g.epsilon if g else float("inf"),
            delta=g.delta if g else 0.0,
            charged_epsilon=charge.epsilon if charge else 0.0,
            charged_delta=charge.delta if charge else 0.0,
            n_reports=release.n_reports,
            vocab_size=release.vocab_size,
            max_n=max_n,
            first_window=windows[0],
            last_window=windows[1],
            privacy_unit=unit.describe(),
            reports_per_user=unit.max_reports,
            statement=release.statement + caveat,
            public_statement=(g.public_statement() if g else release.note) + caveat,
            threshold=release.threshold if np.isfinite(release.threshold) else 0.0,
            discovered=release.discovered,
            request_id=request_id,
            channel=release.channel,
            data_dependent_before=data_dependent_before if release.differentially_private else 0,
        )

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> ReleaseRecord:
        return cls(**json.loads(data))
