"""A sound and useful n-gram release: Gaussian noise on normalised per-report counts, DP discovery
of n-grams missing from the public vocabulary, and the public data as a Bayesian prior afterwards.

The idea of BayesianDP (Ramadan et al.) — public data as a prior — is kept, but the prior enters
only after the noise, as post-processing, so the sensitivity never depends on the data or on the
prior. The guarantee holds for one user's whole contribution (``unit``: at most m reports).

Mechanism
---------
1. Per report r: its first W distinct items (n-grams, words outside the vocabulary's word list
   read as ``<unk>``), counts clamped at C, as a vector c_r; the report's weights
   v_r = c_r / max(‖c_r‖₂, τ) have ‖v_r‖₂ ≤ 1 and every entry ≤ 1.
2. Weighted totals y_j = Σ_r v_rj for every item j of the public vocabulary P and every other
   item seen (the candidates).
3. Gaussian noise: ỹ_j = y_j + N(0, σ²) independently for j ∈ P and for each candidate.
4. Release every j ∈ P, and a candidate j only if ỹ_j > ρ (discovery).
5. Post-processing with public data only: per order n, the public distribution π over P_n scaled
   to the noisy total T_n = Σ_{j∈P_n} ỹ_j is the prior mean μ_j = T_n·π_j; the prior distribution
   of the ratio truth/μ is estimated from the noisy release itself (empirical Bayes, ``empirical_bayes``:
   a mixture over a grid of ratios fitted by maximum marginal likelihood in quantile bins of μ); the
   posterior mean is the released pseudo-count of j ∈ P (never 0); a discovered candidate keeps
   max(ỹ, 0) (no prior). Where the users' mass of an order is below a quarter of the public
   prior's, the order's pseudo-counts are scaled up to it (``lm_strength``: the strength a
   Kneser–Ney model needs; probabilities within an order are unchanged). A clean estimate (with the
   public local channel) instead releases every order at its public share (``order_scales``).

Privacy (add/remove one user's m reports; D' = D + u)
-----------------------------------------------------
* Sensitivity. The user's contribution is u = Σ of its m vectors v_r, so ‖u‖₂ ≤ m (triangle
  inequality), each entry u_j ≤ m, and u has at most K = m·W non-zero entries. No data-dependent
  quantity enters: W, C, τ and m are public.
* Gaussian part. On any fixed set of coordinates the vector of noisy totals is the Gaussian
  mechanism with ℓ2 sensitivity m; σ is the analytic Gaussian calibration (Balle & Wang 2018)
  for (ε_g, δ_g) and sensitivity m.
* Discovery. Coordinates that are candidates under D' but neither public nor candidates under D
  are exactly the user's items seen by no one else; each has value u_j ≤ m under D' and does
  not exist under D. They are released only if u_j + Z_j > ρ, which happens for one of them with
  probability at most K·Φ̄((ρ − m)/σ) =: δ_s (union bound; ρ = m + σ·Φ̄⁻¹(δ_s / K)). Let E be
  the event that none is released (independent of everything else, P(E) ≥ 1 − δ_s). For any
  output set O: P[M(D') ∈ O] ≤ P[M(D') ∈ O, E] + δ_s ≤ e^ε_g P[M(D) ∈ O] + δ_g + δ_s, and
  P[M(D) ∈ O] ≤ e^ε_g P[G(D') ∈ O] + δ_g ≤ e^ε_g/(1 − δ_s) · P[M(D') ∈ O] + δ_g, where G(D') is
  the Gaussian part on the common coordinates, observed exactly when E holds. So the release is
  (ε_g + ln(1/(1 − δ_s)), δ_g + δ_s)-DP; we set δ_s = δ/2, δ_g = δ − δ_s and ε_g = ε − ln(1/(1 − δ_s))
  so that the total is exactly the requested (ε, δ). Without discovery: (ε, δ)-DP directly.
* Step 5 reads only the noisy totals, σ and public data: post-processing, free.

Floating point: noisy totals are rounded to a grid of spacing 2⁻¹⁰·σ before anything else (a
mitigation in the spirit of Mironov 2012, not a proof).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp
from scipy.special import log_ndtr, ndtri
from threadpoolctl import threadpool_limits

from lac.common.checks import check_int
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit, check_delta, check_epsilon
from lac.common.rng import RandomSource, secure_generator
from lac.curator.base.ngrams import NgramVocabulary, ReportItems, item_array
from lac.curator.release.channel import ITEM_FALSE_ALARM, MIN_KEEP_SHARE, EMStart, NgramChannel, deconvolve
from lac.curator.release.gaussian import analytic_sigma

__all__ = [
    "PosteriorParams",
    "WeightedTotals",
    "PosteriorRelease",
    "weighted_totals",
    "discovery_threshold",
    "posterior_release",
    "EBPrior",
    "OrderFit",
    "eb_fit",
    "eb_means",
    "empirical_bayes",
    "channel_prior",
    "post_process",
    "clean_estimate",
    "clean_mass",
    "deconvolution_target",
    "eb_means_and_target",
    "lm_strength",
    "scale_orders",
]

NAME = "Gaussian posterior (LAC): normalised per-report counts, DP n-gram discovery, public prior afterwards"


@dataclass(frozen=True)
class PosteriorParams:
    """Parameters of one release (defaults chosen on public data; see the evaluation report)."""

    epsilon: float
    delta: float
    W: int = 100
    C: int = 3
    tau: float = 1.0  # weights are c_r / max(‖c_r‖₂, τ); τ = 1: every non-empty report has norm exactly 1
    discovery: bool = True
    discovery_delta_share: float = 0.5  # δ_s = share·δ goes to the discovery threshold
    bins: int = 30  # empirical-Bayes bins of the prior variance (post-processing)
    unit: PrivacyUnit = PrivacyUnit.report()

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta, allow_zero=False)
        for name in ("W", "C", "bins"):
            check_int(getattr(self, name), name)
        if isinstance(self.tau, bool) or not (isinstance(self.tau, Real) and math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"tau must be finite and > 0, got {self.tau!r}")
        if not 0 < self.discovery_delta_share < 1:
            raise ValueError("discovery_delta_share must be in (0, 1)")
        if self.discovery and self.epsilon <= -math.log1p(-self.delta * self.discovery_delta_share):
            raise ValueError("epsilon is too small for discovery at this delta")

    @property
    def m(self) -> int:
        """Reports one user contributes (the ℓ2 sensitivity of the totals)."""
        return self.unit.max_reports

    @property
    def occurrence_weight(self) -> float:
        """The weight 1/max(√W, τ) of one occurrence in a report that fills its W items: what the clean estimate's
        stopping rule takes for the variance of the devices' random choices per unit of weighted total (public;
        reports with fewer items weigh more: measured on the evaluation's user corpora, 0.13–0.16 at W = 100)."""
        return 1.0 / max(math.sqrt(self.W), self.tau)

    @property
    def delta_select(self) -> float:
        """δ_s: the share of δ the discovery threshold spends (0 without discovery)."""
        return self.delta * self.discovery_delta_share if self.discovery else 0.0

    @property
    def epsilon_gauss(self) -> float:
        """The ε the Gaussian counts are calibrated to: ε + log(1 − δ_s) with discovery, else ε."""
        return self.epsilon + math.log1p(-self.delta_select) if self.discovery else self.epsilon

    @property
    def delta_gauss(self) -> float:
        """The δ left for the Gaussian counts: δ − δ_s."""
        return self.delta - self.delta_select

    @property
    def sigma(self) -> float:
        """σ of the Gaussian part: data-independent, so it can be shown to anyone (and previewed)."""
        return analytic_sigma(float(self.m), self.epsilon_gauss, self.delta_gauss)


def discovery_threshold(sigma: float, m: int, K: int, delta_select: float) -> float:
    """ρ = m + σ·Φ̄⁻¹(δ_s / K): K items, each at most m, pass with probability ≤ δ_s (union bound).

    Computed, then checked in log space (Φ̄ by ``log_ndtr``) and raised until K·Φ̄((ρ − m)/σ) ≤ δ_s
    holds in floating point."""
    rho = m + sigma * -float(ndtri(delta_select / K))
    log_target = math.log(delta_select / K)
    while float(log_ndtr(-(rho - m) / sigma)) > log_target:
        rho = math.nextafter(rho, math.inf) + abs(rho) * 1e-12
    return rho


class WeightedTotals:
    """y over the public vocabulary and over the other items seen (the candidates).

    The candidates are kept as Arrow strings with their values, in parts (each part's items distinct),
    and summed only when read: an item's total is its parts' values added in order, exactly what
    adding them one dict entry at a time gave, in the order of first appearance."""

    def __init__(self, public: np.ndarray, candidates: dict[str, float] | None = None, n_reports: int = 0):
        self.public = public  # float64, one per vocabulary item
        self.n_reports = n_reports  # exact: library/operator only
        self._parts: list[tuple[pa.Array, np.ndarray]] = []
        if candidates:
            self.candidates = candidates

    def add_candidates(self, items: pa.Array, values: np.ndarray) -> None:
        """Add one part: distinct ``items`` (Arrow strings) with their values."""
        if len(items):
            self._parts.append((items, np.asarray(values, dtype=np.float64)))

    def candidate_arrays(self) -> tuple[pa.Array, np.ndarray]:
        """The candidates (Arrow strings, in order of first appearance) and their totals."""
        if not self._parts:
            return pa.array([], pa.string()), np.empty(0)
        if len(self._parts) > 1:
            encoded = pc.dictionary_encode(pa.chunked_array([items for items, _ in self._parts])).combine_chunks()
            values = np.concatenate([v for _, v in self._parts])
            # bincount adds in input order from 0.0: ((0 + v1) + v2) + ..., as the dict did
            totals = np.bincount(encoded.indices.to_numpy(), weights=values, minlength=len(encoded.dictionary))
            self._parts = [(encoded.dictionary, totals)]
        return self._parts[0]

    @property
    def candidates(self) -> dict[str, float]:
        """The candidates as a dict (item -> total), in order of first appearance."""
        items, values = self.candidate_arrays()
        return dict(zip(items.to_pylist(), values.tolist()))

    @candidates.setter
    def candidates(self, totals: dict[str, float]) -> None:
        self._parts = []
        self.add_candidates(pa.array(list(totals), pa.string()), np.fromiter(totals.values(), np.float64, len(totals)))

    @property
    def has_candidates(self) -> bool:
        """True when any candidate n-gram has been added."""
        return bool(self._parts)

    def __iadd__(self, other: WeightedTotals) -> WeightedTotals:
        self.public += other.public
        if other.has_candidates:
            self._parts.append(other.candidate_arrays())  # summed first, as other's dict was
        self.n_reports += other.n_reports
        return self


def weighted_totals(
    blocks: Iterable[ReportItems], vocab: NgramVocabulary, W: int, C: int, tau: float, candidates: bool = True
) -> WeightedTotals:
    """Step 1–2 over blocks of reports: y_j = Σ_r c_rj / max(‖c_r‖₂, τ), first W items per report,
    counts clamped at C. Sums over blocks add up, so an engine may compute them per partition.

    ``candidates=False`` (a release without discovery): c_r holds only the vocabulary's items, the
    only coordinates released, so items that will not be released take no share of a report's
    weight or of its W."""
    out = WeightedTotals(np.zeros(len(vocab)))
    for b in blocks:
        n = b.n_reports
        out.n_reports += n
        if b.item_ids.size == 0:
            continue
        names = item_array(b.items)
        cols = vocab.columns(names)
        pub = cols >= 0
        row = np.repeat(np.arange(n), np.diff(b.indptr))
        ids, c = b.item_ids, b.counts
        if not candidates:
            inside = pub[ids]
            row, ids, c = row[inside], ids[inside], c[inside]
        starts = np.searchsorted(row, np.arange(n))  # rows are sorted: each report's first entry
        keep = np.arange(row.size) - starts[row] < W
        row, ids = row[keep], ids[keep]
        c = np.minimum(c[keep], C).astype(np.float64)
        norm = np.sqrt(np.bincount(row, weights=c * c, minlength=n))
        v = c / np.maximum(norm, tau)[row]
        local = np.bincount(ids, weights=v, minlength=len(b.items))
        np.add.at(out.public, cols[pub], local[pub])
        if candidates:
            found = np.flatnonzero(~pub & (local > 0))
            out.add_candidates(names.take(found), local[found])
    return out


@dataclass(frozen=True, eq=False)
class PosteriorRelease:
    """The released items (public vocabulary, then discovered ones) with their pseudo-counts."""

    items: tuple[str, ...]
    pseudo_counts: np.ndarray  # the posterior means, in units of normalised reports (≥ 0)
    noisy_public: np.ndarray  # the noisy totals of the public items (the Gaussian mechanism's output)
    found_noisy: np.ndarray  # the discovered items' noisy totals (the Gaussian mechanism's output), in items' order
    fits: dict[int, OrderFit]  # what step 5 fitted to each order (post-processing; empty: the public counts)
    log_probs: np.ndarray  # log of the pseudo-counts' share of all items (−inf for 0)
    sigma: float
    threshold: float  # ρ (inf without discovery)
    discovered: int
    candidates: int  # exact: library/operator only
    n_reports: int  # exact: library/operator only
    params: PosteriorParams
    guarantee: Guarantee
    channel: str = ""  # the deployment whose local channel the clean estimate used ("": none)

    @property
    def statement(self) -> str:
        """The release's guarantee in words."""
        return self.guarantee.statement()


# The empirical-Bayes prior on each item's ratio r = truth / prior mean: a mixture of narrow
# components centred on a log grid of ratios 10⁻⁴ … 10⁴, each with relative spread equal to the
# grid step, whose weights are fitted to the noisy totals (maximum marginal likelihood, by EM).
_RATIO_GRID = np.exp(np.linspace(math.log(1e-4), math.log(1e4), 97))
_RATIO_SPREAD = float(np.log(_RATIO_GRID[1] / _RATIO_GRID[0]))
_AT_ONE = np.eye(_RATIO_GRID.size)[np.argmin(np.abs(np.log(_RATIO_GRID)))]  # all weight on the grid's r = 1
_AT_ONE.setflags(write=False)
_EB_ITERATIONS = 300
MIN_BIN_ITEMS = 500  # fewest items an empirical-Bayes bin pools
BIN_RELATIVE_ERROR = 0.1  # a bin's prior mass must pin its mean ratio to this relative standard error
# A bin whose noisy total and prior mass are both at most this many of its noise's standard deviations (σ·√items)
# says nothing its noise could not: its ratio stays at 1 (the prior as it is). Fitted, the mixture explains the
# noise's own tail with items far above their prior (measured at ε = 0.1: a fifth of a noise-only order's mass on
# items 10× above it, BENCHMARKS.md). A prior mass above the noise is fitted: a total near 0 then says the ratio is
# small.
NOISE_ONLY_TOTAL = 2.0
LM_PRIOR_SHARE = 0.25  # an order's pseudo-counts carry at least this share of the public prior's mass
# The clean estimate's order shares take the public counts of bigrams and longer less this (Kneser–Ney's usual
# absolute discount): the public vocabulary was chosen from the public text, whose own n-grams therefore cover it
# better than any other text's, most in the longer orders, where counts are small.
PUBLIC_SHARE_DISCOUNT = 0.75


def information_bins(prior_mean: np.ndarray, sigma: float, max_bins: int) -> tuple[np.ndarray, int]:
    """Bins of items by prior mean, largest first, each holding enough prior mass to be estimated:
    Σμ·BIN_RELATIVE_ERROR ≥ σ·√(items) (its mean ratio then has relative standard error ≤ 0.1
    against the noise) and at least MIN_BIN_ITEMS items; what is left over joins the last bin.
    Where the noise swamps everything this is one bin. Returns (bin of each item, bins)."""
    order = np.argsort(-prior_mean, kind="stable")
    cum = np.concatenate([[0.0], np.cumsum(prior_mean[order])])
    n = prior_mean.size
    bins = np.zeros(n, dtype=np.int64)

    def first_end(i: int) -> int:
        cnt = np.arange(1, n - i + 1)
        ok = ((cum[i + 1 :] - cum[i]) * BIN_RELATIVE_ERROR >= sigma * np.sqrt(cnt)) & (cnt >= MIN_BIN_ITEMS)
        return i + int(np.argmax(ok)) + 1 if ok.any() else -1

    i, k = 0, 0
    while i < n:
        j = first_end(i) if k < max_bins - 1 else -1
        if j < 0 or first_end(j) < 0:  # this bin or the rest cannot stand alone: take everything left
            j = n
        bins[order[i:j]] = k
        i, k = j, k + 1
    return bins, k


@dataclass(frozen=True, eq=False)
class EBPrior:
    """The empirical-Bayes prior fitted to one order's noisy totals (``eb_fit``): each item's prior mean μ and,
    per bin of items, the mixture weights over the ratio grid. Post-processing of the noisy totals."""

    prior_mean: np.ndarray
    bins: tuple[tuple[np.ndarray, np.ndarray], ...]  # (items of the bin, weights over _RATIO_GRID)


def eb_fit(noisy: np.ndarray, prior_mean: np.ndarray, sigma: float, bins: int) -> EBPrior:
    """The prior ``empirical_bayes`` fits: per bin of μ (``information_bins``), the mixture weights over
    the ratio grid that maximise the bin's marginal likelihood (EM from a log-normal centred on r = 1); a bin whose
    noisy total and prior mass are both within ``NOISE_ONLY_TOTAL`` standard deviations of its noise keeps r = 1."""
    # One BLAS thread: the EM's matrix-vector products are memory-bound and OpenBLAS's threads spin; with other
    # work on the cores two threads took several times as long as one (benchmarks/bench_eb.py, BENCHMARKS.md).
    with threadpool_limits(1, user_api="blas"):
        return _eb_fit(noisy, prior_mean, sigma, bins)


def _eb_fit(noisy: np.ndarray, prior_mean: np.ndarray, sigma: float, bins: int) -> EBPrior:
    idx = np.flatnonzero(prior_mean > 0)
    if idx.size == 0:
        return EBPrior(prior_mean, ())
    b, k = information_bins(prior_mean[idx], sigma, bins)
    log_grid = np.log(_RATIO_GRID)
    start = np.exp(-0.5 * (log_grid + 0.5) ** 2)  # log-normal(−½, 1): mean ratio 1
    start /= start.sum()
    fitted = []
    for j in range(k):
        sel = idx[b == j]
        if max(float(noisy[sel].sum()), float(prior_mean[sel].sum())) <= NOISE_ONLY_TOTAL * sigma * math.sqrt(sel.size):
            fitted.append((sel, _AT_ONE))
            continue
        lik = _eb_likelihoods(noisy[sel][:, None], prior_mean[sel], _RATIO_GRID, sigma)[0]
        w = start.copy()
        for _ in range(_EB_ITERATIONS):
            w = w * (lik.T @ (1.0 / (lik @ w))) / sel.size
        fitted.append((sel, w))
    return EBPrior(prior_mean, tuple(fitted))


def _eb_likelihoods(
    y: np.ndarray, mu: np.ndarray, grid: np.ndarray, sigma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per item (y: noisy totals with a trailing axis of 1) and grid component: the likelihood (scaled to 1
    at each item's best component), and the component's mean, prior variance and total variance."""
    m = mu[:, None] * grid[None, :]
    tau2 = (m * _RATIO_SPREAD) ** 2
    var = sigma * sigma + tau2
    loglik = -0.5 * (y - m) ** 2 / var - 0.5 * np.log(var)
    return np.exp(loglik - loglik.max(axis=-1, keepdims=True)), m, tau2, var


def eb_means(prior: EBPrior, noisy: np.ndarray, sigma: float, prune: float = 0.0) -> np.ndarray:
    """Posterior means of each item under ``prior`` given its noisy total (``noisy``: one per item of the order).
    Never below μ·10⁻⁴; items with μ = 0 keep max(noisy, 0). ``prune`` > 0 is for many redraws at once
    (``noisy``: draws × items; the error bars' bootstrap): the grid components of a bin whose weight is below
    that share of its largest are left out (a mean moves by about that share) and each component's constants
    are computed once for all draws, in parts of about ``EB_CELLS`` cells; the release itself prunes nothing."""
    noisy = np.asarray(noisy, dtype=np.float64)
    if prune > 0:
        return _eb_means_redrawn(prior, noisy, sigma, prune)[0]
    post = np.maximum(noisy, 0.0)
    s2 = sigma * sigma
    for sel, w in prior.bins:
        y = noisy[sel][:, None]
        lik, m, tau2, var = _eb_likelihoods(y, prior.prior_mean[sel], _RATIO_GRID, sigma)
        resp = lik * w
        resp /= resp.sum(axis=-1, keepdims=True)
        post[sel] = np.maximum(
            (resp * ((y * tau2 + m * s2) / var)).sum(axis=-1), prior.prior_mean[sel] * _RATIO_GRID[0]
        )
    return post


EB_CELLS = 1 << 22  # redraws' posterior means run on about this many (draw × item × component) cells at once


def _eb_means_redrawn(
    prior: EBPrior, noisy: np.ndarray, sigma: float, prune: float, leave_one_out: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """``eb_means`` of many redraws (draws × items): the same normal-mixture posterior means, computed in log space
    with each kept component's constants once (about twice as fast; equal to rounding and pruning); with
    ``leave_one_out``, also each item's posterior mean with its own responsibilities taken out of its bin's weights
    (``deconvolution_target``), else None."""
    post = np.maximum(noisy, 0.0)
    left = post.copy() if leave_one_out else None
    s2 = sigma * sigma
    for sel, w in prior.bins:
        keep = w > prune * w.max()
        m = prior.prior_mean[sel][:, None] * _RATIO_GRID[keep][None, :]
        tau2 = (m * _RATIO_SPREAD) ** 2
        var = s2 + tau2
        half_inv, log_w = (
            0.5 / var,
            np.log(w[keep]) - 0.5 * np.log(var),
        )  # log(weight × likelihood) = log_w − half_inv·d²
        a, b = tau2 / var, m * s2 / var  # the component's posterior mean is a·y + b
        floor = prior.prior_mean[sel] * _RATIO_GRID[0]
        step = max(1, EB_CELLS // m.size)
        for lo in range(0, noisy.shape[0], step):
            y = noisy[lo : lo + step, sel][..., None]
            d = y - m
            d *= d
            d *= half_inv
            np.subtract(log_w, d, out=d)
            d -= d.max(axis=-1, keepdims=True)
            np.exp(d, out=d)
            means = y * a + b
            total = d.sum(axis=-1)
            post[lo : lo + step, sel] = np.maximum((d * means).sum(axis=-1) / total, floor)
            if left is not None and sel.size > 1:
                # d ∝ wₖ·likelihoodₖ; without the item's own responsibilities the weights are items·wₖ − respₖ, so
                # the left-out posterior's component weights are ∝ dₖ·(items − respₖ/wₖ), at least 0
                others = d / (total[..., None] * w[keep])
                np.subtract(sel.size, others, out=others)
                np.maximum(others, 0.0, out=others)
                others *= d
                norm = others.sum(axis=-1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    loo = (others * means).sum(axis=-1) / norm
                plain = post[lo : lo + step, sel]
                left[lo : lo + step, sel] = np.where(norm > 0, np.maximum(loo, floor), plain)
            elif left is not None:
                left[lo : lo + step, sel] = post[lo : lo + step, sel]
    return post, left


def empirical_bayes(noisy: np.ndarray, prior_mean: np.ndarray, sigma: float, bins: int) -> np.ndarray:
    """Posterior means of noisy = truth + N(0, σ²), truth = μ·r, under an estimated prior on r.

    Items are pooled in at most ``bins`` bins of μ (``information_bins``: each bin holds enough
    prior mass for its ratio to stand out of the noise, so weak data give one bin). In each bin
    the prior on r is a mixture over a fixed log grid of ratios (10⁻⁴ … 10⁴) of normals
    N(μ·r_k, (μ·r_k·h)²), h the grid's log step; its weights are the maximum-marginal-likelihood
    fit to the bin's noisy values (EM from a log-normal centred on r = 1; ``eb_fit``). The posterior mean
    of each item (``eb_means``) is a convex combination of normal-normal posterior means: it follows the
    data where they stand out of the noise and the prior where they do not. Never below μ·10⁻⁴ (no public
    item gets probability 0); items with μ = 0 keep max(noisy, 0)."""
    return eb_means(eb_fit(noisy, prior_mean, sigma, bins), noisy, sigma)


@dataclass(frozen=True, eq=False)
class OrderFit:
    """What step 5 fitted to one order's noisy totals (post-processing of DP outputs): its empirical-Bayes prior
    and, for a clean estimate, where the deconvolution's EM started and its number of steps (-1: no channel). The
    error bars hold them."""

    eb: EBPrior
    steps: int = -1
    start: EMStart = "prior"


def channel_prior(alpha: np.ndarray) -> np.ndarray:
    """The public distribution π a clean estimate starts from (uniform when the public counts are all 0)."""
    return alpha / alpha.sum() if alpha.sum() > 0 else np.full(alpha.size, 1.0 / max(alpha.size, 1))


def clean_mass(denoised: np.ndarray, noisy: np.ndarray, prior_mean: np.ndarray) -> np.ndarray:
    """The mass a clean estimate is kept at (over the last axis): the posterior's (``denoised``) on the items the
    channel produces (``prior_mean``, the pushed-through prior, > 0) and the noisy total of those it never produced in
    its Monte Carlo, at least 0. Their posterior keeps max(noisy, 0), whose sum is the noise's positive half: at
    ε = 0.1 over 20k users, half the unigrams' posterior mass."""
    produced = prior_mean > 0
    return denoised[..., produced].sum(axis=-1) + np.maximum(noisy[..., ~produced].sum(axis=-1), 0.0)


def deconvolution_target(eb: EBPrior, noisy: np.ndarray, sigma: float, prune: float = 0.0) -> np.ndarray:
    """What one order's deconvolution fits (items on the last axis, redraws before it): each item's posterior mean
    under its bin's mixture with that item's own responsibilities taken out of the bin's weights (leave one out);
    where nothing else in the bin supports the item's data, its plain posterior mean (``eb_means``). Items with
    μ = 0 keep max(noisy, 0). ``prune``: as ``eb_means`` takes it.

    Why: the mixture is fitted to the same noisy totals, so it puts weight wherever one item alone asks and the
    plain posterior believes a noise spike on an item the prior expects ~0 of; deconvolving divides that item's
    excess by its small chance of being seen intact, and such a spike topped a demo's trigrams though no user wrote
    that trigram. What many items share (real differences from the public corpus) the others still support."""
    return eb_means_and_target(eb, noisy, sigma, prune)[1]


def eb_means_and_target(
    eb: EBPrior, noisy: np.ndarray, sigma: float, prune: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """``eb_means`` and ``deconvolution_target`` of the same noisy totals in one pass (they share each component's
    likelihood): the error bars' bootstrap needs both for every redraw."""
    noisy = np.asarray(noisy, dtype=np.float64)
    means, left = _eb_means_redrawn(eb, noisy.reshape(-1, noisy.shape[-1]), sigma, prune, leave_one_out=True)
    assert left is not None
    return means.reshape(noisy.shape), left.reshape(noisy.shape)


def _clean_estimate(
    noisy: np.ndarray, alpha: np.ndarray, sigma: float, bins: int, A: sp.csr_matrix, occurrence_weight: float
) -> tuple[np.ndarray, OrderFit]:
    prior = channel_prior(alpha)
    pushed = A @ prior
    total = max(float(noisy.sum()), 1.0)
    eb = eb_fit(noisy, total * pushed / max(float(pushed.sum()), 1e-300), sigma, bins)
    denoised, target = eb_means_and_target(eb, noisy, sigma)
    d = deconvolve(
        noisy,
        A,
        prior,
        sigma,
        fit_to=target,
        starts=("prior", "items"),
        occurrence_weight=occurrence_weight,
    )
    clean = d.clean
    mass = float(clean.sum())
    kept = float(clean_mass(denoised, noisy, eb.prior_mean))
    return (clean * (kept / mass) if mass > 0 else clean), OrderFit(eb, d.iterations, d.start)


def clean_estimate(
    noisy: np.ndarray, alpha: np.ndarray, sigma: float, bins: int, A: sp.csr_matrix, occurrence_weight: float = 1.0
) -> np.ndarray:
    """One order's clean totals from the noisy totals of its perturbed public n-grams, A the
    order's channel (observed × clean): the empirical-Bayes posterior under the pushed-through
    prior A·π, deconvolved (``lac.curator.release.channel.deconvolve``: EM from whichever of the prior π and the
    item-wise estimate, ``item_estimate``, of the items that stand out fits the noisy totals better; it fits the
    leave-one-out posterior, ``deconvolution_target``), then scaled to
    the posterior's mass (``clean_mass``; the EM's mass on the public items is inflated by leaks from n-grams the
    public vocabulary does not list, whose chance of being seen intact is small). ``occurrence_weight``: as
    ``deconvolve`` takes it (``PosteriorParams.occurrence_weight`` for normalised per-report counts)."""
    return _clean_estimate(noisy, alpha, sigma, bins, A, occurrence_weight)[0]


def lm_strength(mass: Any, public: float) -> Any:
    """The factor (≥ 1) that gives an order's pseudo-counts at least ``LM_PRIOR_SHARE`` of the
    public prior's count mass ``public``. Where the data are weak the posterior has the prior's shape but
    the users' small mass, and Kneser–Ney over small pseudo-counts over-smooths that shape (its
    discounts are absolute): the posterior keeps part of the prior's strength instead. ``mass``: the order's
    pseudo-count mass, a float for one set of pseudo-counts, an array for several (redraws)."""
    total = np.asarray(mass)
    positive = np.where(total > 0, total, 1.0)
    factor = np.where(total > 0, np.maximum(1.0, LM_PRIOR_SHARE * float(public) / positive), 1.0)
    return float(factor) if factor.ndim == 0 else factor


def order_scales(masses: Mapping[int, Any], public: Mapping[int, float], public_shares: bool) -> dict[int, Any]:
    """The factor each order's pseudo-counts (and its discovered n-grams' values) are multiplied by, from each
    order's released mass ``masses[n]`` (a float, or an array over redraws: the bootstrap's) and the public prior's
    count mass ``public[n]`` (``public_masses``). Without ``public_shares``, each order by itself (``lm_strength``).
    With it (the clean estimate), every order at its public share of the mass, at the lowest order's strength
    relative to the public prior (at least ``LM_PRIOR_SHARE``): perturbation breaks word sequences, so the
    perturbed reports carry far fewer n-grams of the public vocabulary in the higher orders than the clean text
    does, and how many more the channel cannot tell (the clean n-grams outside the vocabulary that perturbation
    moves inside are not identified by it); the public corpus's shares are the better estimate (measured,
    BENCHMARKS.md)."""
    if not public_shares:
        return {n: lm_strength(masses[n], public[n]) for n in masses}
    low = min(masses)
    anchor = np.asarray(masses[low], dtype=np.float64)
    level = np.maximum(LM_PRIOR_SHARE, np.where(anchor > 0, anchor, 0.0) / max(public[low], np.finfo(float).tiny))
    out = {}
    for n, mass in masses.items():
        m = np.asarray(mass, dtype=np.float64)
        factor = np.where((m > 0) & (public[n] > 0), level * public[n] / np.where(m > 0, m, 1.0), 1.0)
        out[n] = float(factor) if factor.ndim == 0 else factor
    return out


def posterior_release(
    totals: WeightedTotals,
    vocab: NgramVocabulary,
    params: PosteriorParams,
    rng: RandomSource | None = None,
    channel: NgramChannel | None = None,
) -> PosteriorRelease:
    """Steps 3–5 on exact totals (see the module docstring for the guarantee).

    With the public local ``channel`` (``lac.curator.release.channel``), step 5 estimates the users'
    *clean* n-gram statistics from the noisy totals of their perturbed reports: per order, the
    empirical-Bayes posterior under the public prior pushed through the channel, deconvolved by
    the channel (EM from the public prior or the item-wise estimate, whichever fits the noisy totals better,
    stopped by the discrepancy principle) and kept at the
    posterior's mass on the public items. It reads only the noisy totals, σ and public data:
    post-processing, the guarantee is the same."""
    if not isinstance(params, PosteriorParams):
        raise TypeError("params must be a PosteriorParams")
    if totals.public.shape != (len(vocab),):
        raise ValueError(f"totals cover {totals.public.size} items, the vocabulary {len(vocab)}")
    rng = secure_generator() if rng is None else rng
    sigma = params.sigma
    grid = sigma * 2.0**-10
    m, K = params.m, params.m * params.W
    noisy_public = np.rint((totals.public + sigma * rng.standard_normal(len(vocab))) / grid) * grid
    found: list[str] = []
    found_values = np.empty(0)
    threshold = math.inf
    names, values = totals.candidate_arrays()
    if params.discovery:
        threshold = discovery_threshold(sigma, m, K, params.delta_select)
        noisy = np.rint((values + sigma * rng.standard_normal(values.size)) / grid) * grid
        passed = np.flatnonzero(noisy > threshold)
        found, found_values = names.take(passed).to_pylist(), noisy[passed]
        order = sorted(range(len(found)), key=found.__getitem__)  # release order: sorted, not the storage order
        found, found_values = [found[i] for i in order], found_values[order]
    found_noisy = found_values
    pseudo, found_values, fits = post_process(
        noisy_public, found, found_values, vocab, sigma, params.bins, channel, params.occurrence_weight
    )
    found, found_noisy = found[: found_values.size], found_noisy[: found_values.size]
    items = tuple(vocab.items) + tuple(found)
    counts = np.concatenate([pseudo, found_values])
    with np.errstate(divide="ignore"):
        log_probs = np.log(counts) - math.log(max(counts.sum(), np.finfo(float).tiny))
    return PosteriorRelease(
        items=items,
        pseudo_counts=counts,
        noisy_public=noisy_public,
        found_noisy=found_noisy,
        fits=fits,
        log_probs=log_probs,
        sigma=sigma,
        threshold=threshold,
        discovered=len(found),
        candidates=len(names),
        n_reports=totals.n_reports,
        params=params,
        guarantee=_guarantee(params, sigma, threshold, len(vocab), channel),
        channel=channel.word.deployment_key if channel is not None else "",
    )


def post_process(
    noisy_public: np.ndarray,
    found: Sequence[str],
    found_values: np.ndarray,
    vocab: NgramVocabulary,
    sigma: float,
    bins: int,
    channel: NgramChannel | None,
    occurrence_weight: float,
) -> tuple[np.ndarray, np.ndarray, dict[int, OrderFit]]:
    """Step 5: the released pseudo-counts of the public items and of the discovered ones, from the
    Gaussian mechanism's outputs only (the noisy totals ``noisy_public``, the discovered items and
    their noisy totals), σ and public data (``vocab``'s counts, the public ``channel``), and what it fitted
    to each order (the error bars hold it). ``occurrence_weight``: of the totals, for the clean estimate's stop
    (``PosteriorParams.occurrence_weight``). With a channel that keeps too few words to estimate the clean
    text from (not ``NgramChannel.informative``), the public counts themselves, nothing discovered and
    nothing fitted: measured end to end, anything estimated from such reports describes the users' text worse
    than the public prior does."""
    if channel is not None and not channel.informative:  # the devices kept too little to estimate from
        channel.order(1, vocab)  # built over this vocabulary (its keep share is)
        return vocab.alpha.astype(np.float64, copy=True), np.empty(0), {}
    pseudo = np.empty(len(vocab))
    orders = vocab.orders
    found_orders = np.array([it.count(" ") + 1 for it in found], dtype=np.int64)
    found_values = np.maximum(np.asarray(found_values, dtype=np.float64), 0.0)
    fits = {}
    for n in np.unique(orders).tolist():
        sel = orders == n
        alpha = vocab.alpha[sel]
        total = max(float(noisy_public[sel].sum()), 1.0)
        mu = total * alpha / alpha.sum() if alpha.sum() > 0 else np.zeros(alpha.size)
        if channel is None:
            eb = eb_fit(noisy_public[sel], mu, sigma, bins)
            pseudo[sel], fits[n] = eb_means(eb, noisy_public[sel], sigma), OrderFit(eb)
        else:
            pseudo[sel], fits[n] = _clean_estimate(
                noisy_public[sel], alpha, sigma, bins, channel.order(n, vocab), occurrence_weight
            )
    scale_orders(pseudo, found_values, found_orders, vocab, fits, channel is not None)
    return pseudo, found_values, fits


def scale_orders(
    pseudo: np.ndarray,
    found: np.ndarray,
    found_orders: np.ndarray,
    vocab: NgramVocabulary,
    orders: Iterable[int],
    clean: bool,
) -> None:
    """Step 5's last part, in place: each of ``orders`` scaled as ``order_scales`` says, its public items'
    ``pseudo``-counts and its discovered n-grams' values (``found``, of orders ``found_orders``) alike; ``clean``:
    a clean estimate (public shares). The last axis is the items; a leading one holds redraws (the bootstrap's)."""
    orders = sorted(orders)
    masses = {n: released_mass(pseudo, found, vocab.orders, found_orders, n, clean) for n in orders}
    for n, scale in order_scales(masses, public_masses(vocab, orders, clean), clean).items():
        factor = np.expand_dims(np.asarray(scale), -1)  # one per redraw, over the items
        pseudo[..., vocab.orders == n] *= factor
        found[..., found_orders == n] *= factor


def public_masses(vocab: NgramVocabulary, orders: Iterable[int], clean: bool) -> dict[int, float]:
    """Each order's public count mass, as ``order_scales`` takes it: for a clean estimate (``clean``), the counts of
    the orders above the lowest less ``PUBLIC_SHARE_DISCOUNT`` each (what text not used to choose the vocabulary
    would put there, in expectation, relative to the lowest order)."""
    orders = sorted(orders)
    out = {}
    for n in orders:
        alpha = vocab.alpha[vocab.orders == n].astype(np.float64)
        discounted = clean and n > orders[0]
        out[n] = float((np.maximum(alpha - PUBLIC_SHARE_DISCOUNT, 0.0) if discounted else alpha).sum())
    return out


def released_mass(
    pseudo: np.ndarray, found: np.ndarray, orders: np.ndarray, found_orders: np.ndarray, n: int, with_found: bool
) -> Any:
    """Order ``n``'s released mass (last axis: items; an array over redraws when there are several): its public
    items' pseudo-counts, with its discovered n-grams' values when ``with_found`` (the clean estimate's shares count
    them)."""
    mass = pseudo[..., orders == n].sum(axis=-1)
    return mass + found[..., found_orders == n].sum(axis=-1) if with_found else mass


def _guarantee(p: PosteriorParams, sigma: float, threshold: float, V: int, channel: NgramChannel | None) -> Guarantee:
    m = p.m
    details = [
        f"Each report's first W={p.W} n-grams (counts clamped at C={p.C}) are weighted by 1/max(‖c‖₂, {p.tau:g}), so "
        f"a report moves the weighted totals by at most 1 in ℓ2 and one user's {m} report(s) by at most {m}; "
        f"Gaussian noise σ = {sigma:.6g} on every total (analytic calibration for (ε, δ) = ({p.epsilon_gauss:.6g}, "
        f"{p.delta_gauss:.3g}), sensitivity {m}) over the {V} public n-grams"
        + (" and every other n-gram seen." if p.discovery else "."),
    ]
    if p.discovery:
        details.append(
            f"An n-gram outside the public vocabulary is released only if its noisy total exceeds ρ = {threshold:.6g}; "
            f"one user's at most {m * p.W} n-grams pass it with probability ≤ δ_s = {p.delta_select:.3g} (union "
            f"bound), which costs (ln(1/(1−δ_s)), δ_s) on top of the Gaussian part: ({p.epsilon:.6g}, "
            f"{p.delta:.3g}) in all."
        )
    details.append(
        "The public counts enter only afterwards, as the prior of an empirical-Bayes posterior computed "
        "from the noisy totals (post-processing). Floating point: noisy totals rounded to σ·2⁻¹⁰ "
        "(a mitigation, not a proof)."
    )
    if channel is not None and not channel.informative:
        w = channel.word
        details.append(
            f"The devices' local channel ({w.deployment_key.split('|words:')[0]}) keeps only "
            f"{channel.keep:.0%} of the public text's words (below {MIN_KEEP_SHARE:.0%}): too few for the "
            f"users' clean statistics to be estimated from their perturbed reports, so the released pseudo-counts "
            f"are the public prior's counts and nothing discovered is listed (the noisy totals are computed and "
            f"charged, then unused; a larger ε per word would let the release say more)."
        )
    elif channel is not None:
        w = channel.word
        details.append(
            f"The public n-grams' pseudo-counts estimate the users' clean text: the noisy totals of their perturbed "
            f"reports are deconvolved with the public local channel ({w.deployment_key.split('|words:')[0]}; Monte "
            f"Carlo, {w.describe()}) — post-processing of the "
            f"noisy totals with public data, so the guarantee above is unchanged. Its EM starts from whichever of the "
            f"public prior and the item-by-item reading of the noisy totals fits them better, reading item by item "
            f"only the n-grams whose noisy totals stand out of the noise (by noise alone, any of an order does with "
            f"chance {ITEM_FALSE_ALARM:.0%}); what it deconvolves leaves out the weight each n-gram's own total gave "
            f"the empirical-Bayes mixture. Discovered n-grams are "
            f"counted as perturbed. How the mass splits between n-gram orders is the public corpus's (its counts of "
            f"longer n-grams less {PUBLIC_SHARE_DISCOUNT:g} each): perturbation breaks word sequences, and the channel "
            f"cannot tell how many of the clean text's longer n-grams it moved out of the public vocabulary."
        )
    return Guarantee(Model.CENTRAL, p.epsilon, p.delta, p.unit, Adjacency.ADD_REMOVE, NAME, details=tuple(details))
