"""Error bars of a release: per released n-gram, the spread the DP noise alone gives its released probability.

Everything here is post-processing: it reads the DP mechanism's outputs (noisy totals, noisy logits, the
discovered n-grams after their DP threshold), the noise's public scale and public data (the prior, the
channel), never the reports or their exact counts. Each release gets, per item and on two scales (the joint
probability over the whole release, and the probability within the item's order, as ``top(order=n)`` shows
it), a centre and a standard deviation; an interval at any level is read from them (``interval``).

* The Gaussian posterior, with or without the channel (``posterior_errors``): a parametric bootstrap.
  ``Bootstrap.draws`` times, fresh Gaussian noise of the release's σ is added to the released noisy totals
  (and to the discovered n-grams' noisy totals) and the release's post-processing is run again: each
  order's empirical-Bayes posterior, the deconvolution by the channel, the discovery threshold, the
  strength scaling and the normalisation. What the release fitted to its noisy totals is held as it was:
  the empirical-Bayes prior (each order's prior mean and mixture weights) and where the deconvolution's EM
  started and its number of steps (refitting them per draw would cost a release's post-processing per draw, and
  their jumps with the noise are not a spread an interval can describe). The standard deviation is the root-mean-square
  distance of the redrawn probabilities from the released one (bias included), the interval the released
  probability ± its normal quantile.
* BayesianDP and EndToEndDP (``logit_errors``): the same bootstrap on the released logits (Gaussian noise
  of the release's σ; the softmax renormalises).
* The Laplace baselines (``laplace_errors``): closed form. A noisy count c̃ = c + Lap(b) has standard
  deviation √2·b; the probability c/Σc is estimated by c̃/Σc̃ (the released probability is thresholded at 0
  and renormalised, which biases it low where the noise dominates the total), with the normaliser's own
  noise added by the delta method, and the interval is read from the Laplace quantiles.
* Releases that are not differentially private (``none``) get no error bars, with the reason.

The bootstrap's generator is a numpy ``Generator`` seeded from the OS (``Bootstrap``; tests give the seed),
never the release's own, so the released values are drawn exactly as without error bars.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from lac.common.config import CORES
from lac.common.privacy import ErrorBarMethod, ErrorBars
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.release.channel import NgramChannel, deconvolve_steps
from lac.curator.release.posterior import (
    OrderFit,
    channel_prior,
    clean_mass,
    eb_means,
    eb_means_and_target,
    scale_orders,
)

__all__ = [
    "DRAWS",
    "Bootstrap",
    "ItemErrors",
    "interval",
    "posterior_errors",
    "held_post_process",
    "logit_errors",
    "laplace_errors",
    "none",
    "orders_of",
]

# Redraws per bootstrap (the curator's error_bar_draws): the standard deviation to about 7% (1/√(2·100)). Each costs
# about the post-processing of one release (for the channel-aware default, its deconvolution's EM steps).
DRAWS = 100
PRUNE = 1e-12  # empirical-Bayes grid components below this share of their bin's largest weight are skipped
DRAW_CHUNK = 25  # redraws run side by side (the deconvolution's sparse products amortise over them)
CHUNK_CELLS = 1 << 22  # logit redraws run on about this many (draw × item) cells at once
ARRAYS = ("center", "sd", "order_center", "order_sd")  # what a release stores, as "error_<name>"


@dataclass(frozen=True)
class Bootstrap:
    """How a release's bootstrap runs: ``draws`` redraws of the DP noise from a numpy generator seeded with
    ``seed`` (None: 128 bits from the OS, recorded with the release)."""

    draws: int = DRAWS
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 2:
            raise ValueError(f"draws must be an integer >= 2, got {self.draws!r}")

    def generator(self) -> tuple[np.random.Generator, int, str]:
        """A fresh generator, its seed and where the seed came from ("the OS" or "the caller")."""
        if self.seed is None:
            seed = secrets.randbits(128)
            return np.random.default_rng(seed), seed, "the OS"
        return np.random.default_rng(self.seed), self.seed, "the caller"


@dataclass(frozen=True, eq=False)
class ItemErrors:
    """Per released item: the centre and standard deviation of its error bar on the joint probability scale
    (``center``, ``sd``) and within its order (``order_center``, ``order_sd``), and what they describe
    (``bars``; its ``family`` says which quantiles an interval takes). No arrays: no error bars."""

    bars: ErrorBars
    center: np.ndarray | None = None
    sd: np.ndarray | None = None
    order_center: np.ndarray | None = None
    order_sd: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a release stores (``error_<name>``; empty without error bars)."""
        return {f"error_{k}": np.asarray(getattr(self, k)) for k in ARRAYS if getattr(self, k) is not None}

    @classmethod
    def stored(cls, bars: ErrorBars, arrays: Mapping[str, np.ndarray]) -> ItemErrors:
        """The error bars of a stored release (``arrays()`` as stored)."""
        return cls(bars, **{k: arrays.get(f"error_{k}") for k in ARRAYS})

    def at(self, items: np.ndarray, level: float, within_order: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sd, low, high) of ``items`` at ``level``, on the joint scale or within their order; NaN without
        error bars."""
        center, sd = (self.order_center, self.order_sd) if within_order else (self.center, self.sd)
        if center is None or sd is None:
            nan = np.full(len(items), math.nan)
            return nan, nan, nan
        low, high = interval(center[items], sd[items], self.bars.family, level)
        return sd[items], low, high


def interval(center: np.ndarray, sd: np.ndarray, family: str, level: float) -> tuple[np.ndarray, np.ndarray]:
    """``center`` ± the ``family`` ("normal" or "laplace") quantile of two-sided ``level`` times ``sd``, cut
    to [0, 1] (probabilities)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if family == "normal":
        q = float(ndtri(0.5 + level / 2))
    elif family == "laplace":  # P(|X| ≤ t) = 1 − exp(−t/b) and sd = √2·b
        q = -math.log1p(-level) / math.sqrt(2.0)
    else:
        raise ValueError(f"unknown family {family!r}")
    return np.clip(center - q * sd, 0.0, 1.0), np.clip(center + q * sd, 0.0, 1.0)


def orders_of(items: Sequence[str]) -> np.ndarray:
    """The order n of each item (its number of tokens)."""
    return np.fromiter((it.count(" ") + 1 for it in items), dtype=np.int64, count=len(items))


def none(reason: str) -> ItemErrors:
    """No error bars, and why."""
    return ItemErrors(ErrorBars(ErrorBarMethod.NONE, reason=reason))


class _RMS:
    """Accumulates, per item, the mean squared distance of redrawn probabilities from the released ones, on
    the joint scale and within each item's order."""

    def __init__(self, counts: np.ndarray, orders: np.ndarray):
        self.orders = orders
        self.center = _normalise(counts[None], orders, within_order=False)[0]
        self.order_center = _normalise(counts[None], orders, within_order=True)[0]
        self.sq = np.zeros(counts.size)
        self.order_sq = np.zeros(counts.size)
        self.draws = 0

    def add(self, counts: np.ndarray) -> None:
        """Add redraws (draws × items) of the released counts."""
        self.sq += ((_normalise(counts, self.orders, False) - self.center) ** 2).sum(axis=0)
        self.order_sq += ((_normalise(counts, self.orders, True) - self.order_center) ** 2).sum(axis=0)
        self.draws += counts.shape[0]

    def errors(self, bars: ErrorBars) -> ItemErrors:
        n = max(self.draws, 1)
        return ItemErrors(bars, self.center, np.sqrt(self.sq / n), self.order_center, np.sqrt(self.order_sq / n))


def _normalise(counts: np.ndarray, orders: np.ndarray, within_order: bool) -> np.ndarray:
    """Counts (draws × items) as probabilities: over all items, or within each item's order (uniform over a
    group whose counts sum to 0)."""
    groups = np.unique(orders).tolist() if within_order else [None]
    out = np.empty_like(counts, dtype=np.float64)
    for n in groups:
        sel = slice(None) if n is None else orders == n
        c = counts[:, sel]
        total = c.sum(axis=1, keepdims=True)
        out[:, sel] = np.where(total > 0, c / np.where(total > 0, total, 1.0), 1.0 / max(c.shape[1], 1))
    return out


def _chunks(draws: int, step: int) -> list[int]:
    """Sizes of ``draws`` redraws in chunks of at most ``step``."""
    return [min(step, draws - i) for i in range(0, draws, step)]


def posterior_errors(
    noisy_public: np.ndarray,
    found: Sequence[str],
    found_noisy: np.ndarray,
    pseudo_counts: np.ndarray,
    fits: Mapping[int, OrderFit],
    vocab: NgramVocabulary,
    sigma: float,
    threshold: float,
    channel: NgramChannel | None,
    boot: Bootstrap,
) -> ItemErrors:
    """The Gaussian posterior's error bars by a parametric bootstrap (module docstring), from its DP outputs
    (``noisy_public``, the discovered items ``found`` with their noisy totals ``found_noisy`` — all of them
    above the DP threshold ``threshold``), its released ``pseudo_counts``, what its post-processing fitted to
    them (``fits``), σ and public data (``vocab``, ``channel``)."""
    orders = np.concatenate([vocab.orders, orders_of(found)])
    rms = _RMS(np.asarray(pseudo_counts, dtype=np.float64), orders)
    given = ("the public prior",) + ((f"the public local channel ({_channel_name(channel)})",) if channel else ())
    noise = f"Gaussian noise σ = {sigma:.6g} on each n-gram's noisy total"
    if not fits:  # the release is the public prior's counts: the noise moves nothing
        noise += ", which does not move the released probabilities (the public prior's): standard deviation 0"
        return rms.errors(ErrorBars(ErrorBarMethod.CLOSED_FORM, noise, given=given))
    rng, seed, source = boot.generator()
    sizes = _chunks(boot.draws, DRAW_CHUNK)

    def redraw(size: int) -> tuple[np.ndarray, np.ndarray]:  # drawn in order from the seeded generator
        return (
            noisy_public[None, :] + sigma * rng.standard_normal((size, noisy_public.size)),
            found_noisy[None, :] + sigma * rng.standard_normal((size, found_noisy.size)),
        )

    def post(drawn: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return held_post_process(drawn[0], found, drawn[1], fits, vocab, sigma, threshold, channel, np.float32)

    # chunks run side by side on the cores (the sparse products and numpy's array work release the GIL)
    workers = min(CORES, len(sizes))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lac-errorbars") as pool:
        for wave in range(0, len(sizes), workers):
            for counts in pool.map(post, [redraw(size) for size in sizes[wave : wave + workers]]):
                rms.add(counts)
    steps = any(fit.steps >= 0 for fit in fits.values())
    return rms.errors(
        ErrorBars(
            ErrorBarMethod.BOOTSTRAP,
            noise,
            draws=boot.draws,
            seed=seed,
            seed_source=source,
            given=given,
            held=("the empirical-Bayes prior",)
            + (("where the deconvolution's EM started and its number of steps",) if steps else ()),
            not_covered=("the prior's bias",) + (("the channel model's error",) if channel else ()),
        )
    )


def held_post_process(
    noisy: np.ndarray,
    found: Sequence[str],
    found_noisy: np.ndarray,
    fits: Mapping[int, OrderFit],
    vocab: NgramVocabulary,
    sigma: float,
    threshold: float,
    channel: NgramChannel | None,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """The posterior's step 5 (``lac.curator.release.posterior.post_process``) with what the release fitted held
    (``fits``: each order's empirical-Bayes prior, and where its deconvolution started and its number of steps), for
    several sets of noisy totals at once: ``noisy`` (draws × public items) and the discovered items' (draws ×
    ``found``), each released only above ``threshold`` as discovery does. Returns the pseudo-counts (draws × public
    then discovered items). At the release's own noisy totals it gives its pseudo-counts again (to rounding).
    ``dtype``: of the deconvolution's EM steps (the bootstrap runs them in float32: its standard deviations are good
    to a few percent, float32's rounding is ~1e-7 relative)."""
    V = len(vocab)
    found_orders = orders_of(found)
    counts = np.zeros((noisy.shape[0], V + len(found)))
    counts[:, V:] = np.where(found_noisy > threshold, found_noisy, 0.0)  # discovery, run again
    for n, fit in fits.items():
        sel = np.flatnonzero(vocab.orders == n)
        if fit.steps < 0 or channel is None:
            h = eb_means(fit.eb, noisy[:, sel], sigma, prune=PRUNE)
        else:
            A, prior = channel.order(n, vocab), channel_prior(vocab.alpha[sel])
            h, target = eb_means_and_target(fit.eb, noisy[:, sel], sigma, PRUNE)
            x = deconvolve_steps(target.T, A, prior, fit.steps, dtype, fit.start, noisy[:, sel].T, sigma).T
            mass = x.sum(axis=1, keepdims=True)
            kept = clean_mass(h, noisy[:, sel], fit.eb.prior_mean)[:, None]
            h = np.where(mass > 0, x * (kept / np.where(mass > 0, mass, 1.0)), x)
        counts[:, sel] = h
    aware = channel is not None and any(fit.steps >= 0 for fit in fits.values())
    scale_orders(counts[:, :V], counts[:, V:], found_orders, vocab, fits, aware)
    return counts


def _channel_name(channel: NgramChannel | None) -> str:
    return channel.word.deployment_key.split("|words:")[0] if channel is not None else ""


def logit_errors(log_probs: np.ndarray, sigma: float, orders: np.ndarray, boot: Bootstrap) -> ItemErrors:
    """BayesianDP's and EndToEndDP's error bars: a parametric bootstrap of Gaussian noise of the release's σ
    on its released logits (``log_probs``: the softmax renormalises), the released probability its centre."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    probs = np.exp(log_probs)
    rms = _RMS(probs, orders)
    rng, seed, source = boot.generator()
    for size in _chunks(boot.draws, max(1, CHUNK_CELLS // probs.size)):
        h = log_probs[None, :] + sigma * rng.standard_normal((size, probs.size))
        rms.add(np.exp(h - h.max(axis=1, keepdims=True)))
    return rms.errors(
        ErrorBars(
            ErrorBarMethod.BOOTSTRAP,
            f"Gaussian noise σ = {sigma:.6g} on each n-gram's logit",
            draws=boot.draws,
            seed=seed,
            seed_source=source,
            given=("the public prior",),
            not_covered=("the prior's bias",),
        )
    )


def laplace_errors(noisy: np.ndarray, scale: float, orders: np.ndarray, known_total: float | None) -> ItemErrors:
    """The Laplace baselines' error bars (closed form): noisy values c̃ = c + Lap(``scale``) of quantities whose
    probabilities are c/Σc; ``known_total``: Σc when it is public (Laplace with public data releases a
    distribution, Σ = 1), else estimated by Σc̃ (Laplace on counts). Within an order the total is always
    estimated. A total that does not stand 3 standard deviations out of its own noise is taken as 3."""
    noisy = np.asarray(noisy, dtype=np.float64)
    b2 = 2.0 * scale * scale  # the variance of one Laplace draw
    out = {}
    for name, groups in (("", [slice(None)]), ("order_", [orders == n for n in np.unique(orders).tolist()])):
        center, sd = np.empty(noisy.size), np.empty(noisy.size)
        for sel in groups:
            c = noisy[sel]
            if known_total is not None and name == "":
                center[sel], sd[sel] = c / known_total, math.sqrt(b2) / known_total
                continue
            total = max(float(c.sum()), 3.0 * math.sqrt(b2 * c.size))
            p = c / total
            center[sel] = p
            sd[sel] = np.sqrt(b2 * ((1.0 - p) ** 2 + p * p * (c.size - 1))) / total
        out[f"{name}center"], out[f"{name}sd"] = center, sd
    estimate = "the noisy probability c̃" if known_total is not None else "the unbiased estimate c̃/Σc̃"
    return ItemErrors(
        ErrorBars(
            ErrorBarMethod.CLOSED_FORM,
            f"Laplace noise of scale b = {scale:.6g}, standard deviation √2·b, on each n-gram's noisy value",
            family="laplace",
            center=f"{estimate} (the released probability is thresholded at 0 and renormalised, so it can lie "
            f"outside the interval where the noise dominates)",
        ),
        **out,
    )
