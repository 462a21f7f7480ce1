"""What every central mechanism is built from: the public caps, where the reports come from, the folds an
engine runs over them, and the ``Release`` a mechanism returns.

* ``PublicCaps``: what the curator's configuration fixes (W, C, the clip M, the EndToEndDP
  validation cap); never part of a request, so an analyst cannot tune a sensitivity to the data.
* ``Reports``: where the reports come from: ``StoredReports`` (the curator's segments, read one at a
  time), ``ItemReports`` (in memory) or ``MatrixReports`` (an offline counts matrix over the
  vocabulary). Mechanisms over the public vocabulary read its per-report counts; the default
  mechanism (``lac.curator.release.posterior``) reads every n-gram of every report.
* ``Release``: the released items, log-probabilities and pseudo-counts, and the typed ``Guarantee`` its
  statement is rendered from.
* the folds (``block_totals``, ``block_stats``, ``block_max_sq_dist``, ``stream_stats``) an engine
  (``lac.curator.engines.local``) runs block by block, and ``counted_baseline`` for the baselines.

The request (``ReleaseSpec``) and the registry that runs it are ``lac.curator.mechanisms``; running a
request and recording it, ``lac.curator.runner.run``.

Data-dependent sensitivities (the papers' "bruteforce", "claim1", laplace-public "observed")
and k-anonymity are never differentially private: their releases carry that label and callers
must not charge them to a privacy budget (``Release.charge`` is None). The charge is the mechanism's
privacy map's, stamped by ``lac.curator.mechanisms.release``; a ``Release`` never computes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from lac.common.checks import check_int
from lac.common.privacy import Budget, Guarantee, GuaranteedResult, PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator.base.ngrams import NgramVocabulary, ReportItems, cap_and_clamp
from lac.curator.engines.local import Engine
from lac.curator.release.baselines import BaselineRelease
from lac.curator.release.bayesian import LOG_THETA_GRID, CountStats, bruteforce_sq_dists, count_stats
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap, ItemErrors, laplace_errors, none
from lac.curator.release.posterior import WeightedTotals, weighted_totals
from lac.curator.store import segments

__all__ = [
    "PublicCaps",
    "Release",
    "ReleaseInputs",
    "Reports",
    "StoredReports",
    "ItemReports",
    "MatrixReports",
    "vocab_counts",
    "counted_baseline",
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
            object.__setattr__(self, name, check_int(getattr(self, name), name))


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
    """Reports already extracted in memory (``lac.curator.base.ngrams.report_items`` with the vocabulary's words)."""

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


@dataclass(frozen=True)
class ReleaseInputs:
    """What a run reads besides the spec: the reports, the public vocabulary and caps, the privacy unit,
    the generator, the engine that folds the reports, the deployment's local channel and how to bootstrap
    error bars (None: none asked for)."""

    reports: Reports
    vocab: NgramVocabulary
    caps: PublicCaps
    unit: PrivacyUnit
    rng: RandomSource | None
    engine: Engine
    channel: NgramChannel | None = None
    errors: Bootstrap | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class Release(GuaranteedResult):
    """A computed release: what is published (items, log-probabilities, pseudo-counts), what it guarantees
    and what it is charged (built with keywords; the one result type of every central mechanism)."""

    mechanism: str
    items: tuple[str, ...]
    log_probs: np.ndarray
    pseudo_counts: np.ndarray | None  # the posterior mechanism's counts (None: a distribution only)
    guarantee: Guarantee | None  # None: k-anonymity (no guarantee at all)
    n_reports: int  # exact: library/operator only
    vocab_size: int
    note: str = ""  # the statement when there is no guarantee
    sensitivity_method: str = "sound"
    gamma: float = 0.0
    sigma: float = 0.0
    calibration: str = ""
    laplace_scale: float = 0.0
    params: dict[str, float] = field(default_factory=dict)  # public knobs and caps
    threshold: float = 0.0  # the discovery threshold (posterior)
    discovered: int = 0  # n-grams released by discovery (a DP output)
    channel: str = ""  # the deployment whose public local channel estimated the clean statistics ("": none)
    errors: ItemErrors | None = None  # per-item error bars (None: not asked for, e.g. an evaluation's releases)
    # what it spends from each window it covers: its mechanism's privacy map (None: not DP, never charged)
    charge: Budget | None = None


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


def counted_baseline(
    mechanism: str,
    inputs: ReleaseInputs,
    from_stats: Callable[[CountStats], BaselineRelease],
    from_counts: Callable[[sp.csr_matrix], BaselineRelease],
) -> Release:
    """A baseline over the vocabulary's per-report counts (first W items, clamped at C): from column totals
    streamed block by block through the inputs' engine, or from an offline counts matrix as given; with its
    error bars unless ``inputs.errors`` is None."""
    reports, vocab, caps, errors = inputs.reports, inputs.vocab, inputs.caps, inputs.errors
    items = tuple(vocab.items)
    if not isinstance(reports, MatrixReports):
        stats = stream_stats(reports, vocab, caps.C, caps.W, inputs.engine)
        common = dict(vocab_size=len(items), n_reports=stats.n_users)
        return baseline_release(mechanism, items, from_stats(stats), common, vocab.orders, errors)
    U = reports.vocab_counts(caps.C, caps.W)
    common = dict(vocab_size=len(items), n_reports=int(U.shape[0]))
    return baseline_release(mechanism, items, from_counts(U), common, vocab.orders, errors)


NOT_DP_NO_ERRORS = (
    "The noise scale of this release is a function of the data (NOT differentially private): error bars computed "
    "from it would reveal a data-derived number, so none are given."
)
KANON_NO_ERRORS = (
    "k-anonymity adds no noise: its values are exact clamped counts of the n-grams held by at least K users, and "
    "its error (the suppressed n-grams) is not one an error bar describes."
)


def baseline_errors(b: BaselineRelease, orders: np.ndarray) -> ItemErrors:
    """A baseline's error bars: closed form from the Laplace scale (the public-data variant releases a
    distribution, whose total 1 is public), none for k-anonymity or a data-dependent scale."""
    if b.guarantee is None or b.noisy is None:
        return none(KANON_NO_ERRORS)
    if b.data_dependent:
        return none(NOT_DP_NO_ERRORS)
    return laplace_errors(b.noisy, b.scale, orders, 1.0 if b.mechanism == "laplace-public" else None)


def baseline_release(
    mechanism: str,
    items: tuple[str, ...],
    b: BaselineRelease,
    common: dict[str, Any],
    orders: np.ndarray | None = None,
    errors: Bootstrap | None = None,
) -> Release:
    """The release of a baseline (``lac.curator.release.baselines``): its probabilities as rounded
    log-probabilities, with its error bars (``baseline_errors`` over the items' ``orders``) unless ``errors`` is
    None."""
    with np.errstate(divide="ignore"):
        log_probs = np.log(b.probs)
    return Release(
        mechanism=mechanism,
        items=items,
        log_probs=rounded(log_probs),
        pseudo_counts=None,
        guarantee=b.guarantee,
        note=b.note,
        sensitivity_method=b.sensitivity_method,
        laplace_scale=b.scale,
        params={k: float(v) for k, v in b.params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        errors=None if errors is None or orders is None else baseline_errors(b, orders),
        **common,
    )
