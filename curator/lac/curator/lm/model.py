"""A language model over released n-gram counts (post-processing of a release: costs no privacy).

Input: n-gram *items* as in ``lac.curator.base.ngrams`` (tokens joined by single spaces, sentences
padded ``<s> w1 .. wk </s>``, ``<s>`` never an item on its own) with one real-valued,
non-negative *pseudo-count* per item (``NgramModel.from_counts``), or a released joint
distribution over the items of every order (``NgramModel(items, log_probs, max_n, total=...)``:
pseudo-counts exp(log_probs) · total, log_probs renormalised to sum to 1 first).

The language model of a release is built by one function, ``release_model`` (from its
pseudo-counts when it has them, else from its distribution), on every route: the curator's
queries, an offline release file (``NgramModel.from_release_file``) and ``lac eval``.

Three views of it:

* ``prob(g)``: the joint of ``g`` within its order n under the smoothed model (``smoothed_joint``,
  renormalised over the release's n-gram items), positive for every item of the release, even
  one whose count was clipped to 0; 0 for an n-gram that is not an item.
* ``next_word(context, k)``: what the release says, unsmoothed: P(w | h) = c(h w) / Σ_v c(h v)
  for the longest suffix h of the context (at most max_n − 1 tokens) that has a continuation
  with a positive count; shorter suffixes are tried in turn, down to the unigrams.
* A smoothed model (``conditional``, ``perplexity``, ``arpa``/``write_arpa``): interpolated
  Kneser–Ney (Kneser & Ney 1995; Chen & Goodman 1998), by default *modified* KN, i.e. three
  discounts per order for counts of 1, 2 and 3+.

The estimator, for the highest order N present (1 ≤ N ≤ max_n)::

    P(w | h) = (a(hw) − D(a(hw))) / a(h·)  +  γ(h) · P(w | h⁻),   γ(h) = Σ_v D(a(hv)) / a(h·)

with a(h·) = Σ_v a(hv), h⁻ = h without its first token, and γ(h) = 1 (pure back-off) for a
context without positive counts. Adjusted counts a(g) are the counts c(g) at order N and for
n-grams that start with ``<s>`` (nothing can precede them), and otherwise *continuation* counts
a(g) = Σ_v φ(c(v g)) over the (n+1)-grams v g. At the bottom the unigram discount mass goes to
the uniform distribution over the vocabulary: P(w) = (a(w) − D(a(w))) / a(·) + γ₀ / |V|, so no
word has probability 0 (unless a unigram discount of 0 is forced, see ``discount``).

Fractional counts. Releases are noisy, so counts are reals, many of them small. KN is
generalised with two continuous functions that equal the integer definitions on integers:

* the discount of a count c: D(c) = min(c, D₁) for c < 1, then linear through (1, D₁), (2, D₂),
  (3, D₃₊) and constant D₃₊ beyond 3 (plain KN: D₁ = D₂ = D₃₊ = D, so D(c) = min(c, D)). It
  never exceeds the count, so discounted counts stay non-negative and every context's
  distribution sums to 1; a pseudo-count below the discount (most likely noise) is discounted
  entirely and its mass goes to the lower order;
* the type indicator φ(c) = min(1, c): an n-gram with pseudo-count 0.3 is 0.3 of a type in
  continuation counts (N₁₊(·g) for integers).

For integer counts this is exactly interpolated (modified) KN, built as KenLM's ``lmplz`` builds
it (adjusted counts, raw counts for ``<s>``-initial n-grams, unigrams interpolated with the
uniform distribution; not compared with ``lmplz`` itself, which the ``kenlm`` wheel does not
ship). The expected KN of Zhang & Chiang (2014) was not used: it needs a
distribution over each item's count (fractional counts as sums of Bernoulli events), which a
release does not have, and it does not reduce to KN on integer counts from one aggregate number.

Discounts (``discount=None``) are estimated per order from the count-of-counts n_k (k = 1..4)
of the adjusted counts: modified KN, Y = n₁ / (n₁ + 2 n₂), D_k = k − (k+1) Y n_{k+1} / n_k;
plain KN (``modified=False``), D = n₁ / (n₁ + 2 n₂). For fractional counts n_k = Σ_g max(0,
1 − |a(g) − k|) (a count of 1.3 is 0.7 of a "one" and 0.3 of a "two"), exact for integers.
As in KenLM, if n₁, n₂ or n₃ is 0 (plain KN: n₁ or n₂) or an estimate is out of range
(0 < D₁ ≤ 1, 0 ≤ D₂ ≤ 2, 0 ≤ D₃₊ ≤ 3), the order uses KenLM's fallback (0.5, 1, 1.5) (plain KN:
0.5). D₁ > 0 keeps a uniform share at the bottom, so no word has probability 0.

Vocabulary and ``<unk>``: the vocabulary is the unigram items plus ``</s>`` and ``<unk>``; any
other word (in queries, or inside higher-order items) is read as ``<unk>``. If the items contain
a ``<unk>`` unigram, its counts are used like any word's; otherwise ``unk_mass`` (if given) is
P(<unk>) at the unigram level (the other words share 1 − unk_mass), and without it ``<unk>``
gets only its uniform share γ₀ / |V| (as in KenLM).

Checked against nltk: with the same items, ``discount=[0, D, D]`` gives exactly the
probabilities of ``nltk.lm.KneserNeyInterpolated(discount=D)``. The definitional differences:
nltk uses one D for all orders (default 0.1; estimated per order here), does not discount
unigrams (no uniform share: unseen words get 0), and treats a context shorter than order − 1
(``<s>`` alone) with continuation counts, so it needs its own double ``<s> <s>`` padding where
we, like KenLM, use the raw counts of ``<s> w``. On the Lee corpus (90% / 10%, words seen once
as ``<unk>``) exact counts give held-out perplexity 136.7 here (plain KN 138.3), nltk 141.2 at
D = 0.75 and 490.9 at its default 0.1, the former constant-λ model 410
(``benchmarks/bench_lm.py``).

A release scaled by ``total`` (``NgramModel(items, log_probs, max_n, total=...)``): pass the
release's (DP-estimated) total count over all items; by default (``default_total``) the 10%
quantile of the positive probabilities is read as one occurrence, exact for exact counts with at
least 10% singletons, but an overestimate for noisy releases (less smoothing than they need).

Back-off form and ARPA. The interpolated model is exactly a back-off model: store P(w | h) for
the n-grams h w of the model and use bow(h) = γ(h); for an n-gram not stored the interpolation's
first term is 0, so P(w | h) = γ(h) P(w | h⁻). The model's n-grams are the items with a positive
count closed under prefixes and suffixes (an added prefix or suffix has its value from the
model). ``conditional`` evaluates this back-off model and ``write_arpa`` writes it (log10,
``<s>`` with −99), so the ARPA file, KenLM reading it, and ``conditional`` agree.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Sequence
from functools import cached_property
from itertools import repeat
from pathlib import Path

import numpy as np

from lac.common.checks import check_int
from lac.common.files import atomic_file
from lac.common.text import BOS, EOS, UNK

__all__ = [
    "NgramModel",
    "release_model",
    "UNK",
    "FALLBACK_DISCOUNTS",
    "TOTAL_QUANTILE",
    "count_of_counts",
    "estimate_discounts",
    "default_total",
]

FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM's --discount_fallback
TOTAL_QUANTILE = 0.1  # default_total: this quantile of the positive probabilities is read as one occurrence
MAX_COUNT_RATIO = 1e9  # default_total: probabilities this many times below the largest are read as 0

Discounts = tuple[float, float, float]


def _tokens(x: str | Sequence[str]) -> tuple[str, ...]:
    return tuple(x.split()) if isinstance(x, str) else tuple(x)


def _split_items(items: list) -> tuple[list[str], np.ndarray, list[str]]:
    """(items as strings, their orders, all their tokens in a row); ValueError for an empty item."""
    strs = [it if isinstance(it, str) else " ".join(it) for it in items]
    orders = np.fromiter((s.count(" ") + 1 for s in strs), dtype=np.int64, count=len(strs))
    joined = " ".join(strs)
    flat = joined.split(" ")
    if len(flat) != int(orders.sum()) or not all(flat) or len(joined.split()) != len(flat):
        # irregular whitespace somewhere (or an empty item): split each item
        toks = [s.split() for s in strs]
        if any(not t for t in toks):
            raise ValueError("empty n-gram in items")
        strs = [" ".join(t) for t in toks]
        orders = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        flat = [x for t in toks for x in t]
    return strs, orders, flat


def _check_max_n(max_n) -> None:
    check_int(max_n, "max_n")


def count_of_counts(counts: np.ndarray, kmax: int = 4) -> np.ndarray:
    """n_k for k = 1..kmax: how many counts equal k; a fractional count c adds max(0, 1 − |c − k|)
    to n_k (exact for integer counts)."""
    c = np.asarray(counts, dtype=np.float64)
    c = c[(c > 0) & (c < kmax + 1)]
    return np.array([np.clip(1.0 - np.abs(c - k), 0.0, None).sum() for k in range(1, kmax + 1)])


def estimate_discounts(counts: np.ndarray, modified: bool = True) -> Discounts:
    """(D₁, D₂, D₃₊) from the count-of-counts of one order (Chen & Goodman; plain KN if not
    ``modified``: D = n₁/(n₁ + 2n₂) three times); ``FALLBACK_DISCOUNTS`` when undefined."""
    n = count_of_counts(counts)
    if n[0] <= 0 or n[1] <= 0:
        return (FALLBACK_DISCOUNTS[0],) * 3 if not modified else FALLBACK_DISCOUNTS
    y = n[0] / (n[0] + 2 * n[1])
    if not modified:
        return (float(y),) * 3
    if n[2] <= 0:
        return FALLBACK_DISCOUNTS
    d1, d2, d3 = (float(k - (k + 1) * y * n[k] / n[k - 1]) for k in (1, 2, 3))
    if not (0 < d1 <= 1 and 0 <= d2 <= 2 and 0 <= d3 <= 3):
        return FALLBACK_DISCOUNTS
    return d1, d2, d3


def default_total(probs: np.ndarray) -> float:
    """The total count a release is scaled to when none is given: 1 / (the ``TOTAL_QUANTILE``
    quantile of the positive probabilities), i.e. that item is read as occurring once. Exact for
    a release of exact counts in which at least that share of the items occur once (natural text:
    about half of all n-gram types are singletons); 1.0 if nothing is positive. Probabilities below
    ``MAX_COUNT_RATIO``⁻¹ times the largest are read as 0: no real item occurs more than 10⁹ times
    as often as another that occurs at all, and such tails (e.g. exp(−700) in a sampled release
    whose noise swamped the signal) would otherwise set an absurd total."""
    p = np.asarray(probs, dtype=np.float64)
    p = p[p >= p.max(initial=0.0) / MAX_COUNT_RATIO]
    p = p[p > 0]
    if p.size == 0:
        return 1.0
    return float(1.0 / np.quantile(p, TOTAL_QUANTILE, method="lower"))


def _discount(a: np.ndarray, d: Discounts) -> np.ndarray:
    """D(a): min(a, D₁) below 1, linear through (1, D₁), (2, D₂), (3, D₃₊), then D₃₊."""
    return np.where(a < 1.0, np.minimum(a, d[0]), np.interp(a, (1.0, 2.0, 3.0), d))


def _check_discount(d, n: int) -> Discounts:
    if isinstance(d, (int, float, np.floating, np.integer)) and not isinstance(d, bool):
        d = (float(d),) * 3
    try:
        d = tuple(float(x) for x in d)
    except TypeError:
        raise ValueError(f"discount for order {n} must be a number or (D1, D2, D3+), got {d!r}") from None
    if len(d) != 3 or not all(math.isfinite(x) and 0 <= x <= k for k, x in zip((1, 2, 3), d)):
        raise ValueError(f"discount for order {n} must satisfy 0 <= D_k <= k, got {d!r}")
    return d


class NgramModel:
    """Language model of one release; see the module docstring for the views and the estimator.

    ``NgramModel(items, log_probs, max_n, total=None, **options)`` builds it from a released
    joint distribution as ``from_counts`` on exp(log_probs) · total (``total``: the release's
    total count over all items; default ``default_total``). Options as in ``from_counts``.
    """

    def __init__(
        self, items: Sequence[str], log_probs: np.ndarray, max_n: int = 3, *, total: float | None = None, **options
    ):
        lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
        items = list(items)
        if lp.size != len(items):
            raise ValueError(f"{lp.size} log-probabilities for {len(items)} items")
        if np.isnan(lp).any() or (lp == np.inf).any():
            raise ValueError("log_probs must not be NaN or +inf")
        top = lp.max(initial=-np.inf)
        p = np.exp(lp - top) if top > -np.inf else np.zeros_like(lp)
        if p.sum() > 0:
            p /= p.sum()
        if total is None:
            total = default_total(p)
        if isinstance(total, bool) or not (
            isinstance(total, (int, float, np.integer, np.floating)) and math.isfinite(total) and total > 0
        ):
            raise ValueError(f"total must be finite and > 0, got {total!r}")
        self._build(items, p * float(total), max_n, **options)

    @classmethod
    def from_counts(
        cls,
        items: Sequence[str],
        counts: np.ndarray,
        max_n: int = 3,
        *,
        modified: bool = True,
        discount=None,
        unk_mass: float | None = None,
        partial: bool = False,
    ) -> NgramModel:
        """Interpolated Kneser–Ney over real-valued non-negative pseudo-counts, one per item
        (duplicated items add up; items longer than ``max_n`` are ignored).

        ``modified``: three discounts per order (Chen & Goodman) or one (plain KN), estimated
        when ``discount`` is None. ``discount``: a number D (every order, D₁ = D₂ = D₃₊ = D), or a
        sequence of ``max_n`` entries, order 1 first, each a number or (D₁, D₂, D₃₊) with
        0 ≤ D_k ≤ k; the order-1 discount is the mass given to the uniform distribution (0: no
        uniform share, as in nltk, and unseen words get probability 0). ``unk_mass``: P(<unk>)
        when the items have no ``<unk>`` unigram (see the module docstring).
        """
        self = cls.__new__(cls)
        self._build(
            list(items), counts, max_n, modified=modified, discount=discount, unk_mass=unk_mass, partial=partial
        )
        return self

    # -- construction ------------------------------------------------------------------------

    def _build(
        self,
        items: list,
        counts,
        max_n: int,
        *,
        modified: bool = True,
        discount=None,
        unk_mass: float | None = None,
        partial: bool = False,
    ) -> None:
        _check_max_n(max_n)
        c = np.asarray(counts, dtype=np.float64).reshape(-1)
        if c.size != len(items):
            raise ValueError(f"{c.size} counts for {len(items)} items")
        if not np.isfinite(c).all() or (c < 0).any():
            raise ValueError("counts must be finite and >= 0")
        strs, orders, flat = _split_items(items)
        starts = np.cumsum(orders) - orders
        uni = {flat[i] for i in starts[orders == 1].tolist()} - {BOS}
        if unk_mass is not None:
            if isinstance(unk_mass, bool) or not (isinstance(unk_mass, (int, float, np.floating)) and 0 < unk_mass < 1):
                raise ValueError(f"unk_mass must be in (0, 1), got {unk_mass!r}")
            if UNK in uni:
                raise ValueError("unk_mass is for releases without a <unk> unigram; this one has one")
            unk_mass = float(unk_mass)
        self.max_n = int(max_n)
        self.modified = bool(modified)
        self.unk_mass = unk_mass
        self.total = float(c.sum())  # the total (pseudo-)count over all items
        self._items, self._item_counts = strs, c
        words = [BOS, *sorted(uni | {EOS, UNK})]  # id 0 is <s>; ids follow the words' sort order
        wid = {w: i for i, w in enumerate(words)}
        self._words, self._wid = words, wid
        unk, eos, B = wid[UNK], wid[EOS], len(words)
        self._B = B
        kdt = np.int64 if B**self.max_n < 2**62 else object  # key of n-gram g: Σ id(g_i) B^(n-1-i)
        ids = np.fromiter(map(wid.get, flat, repeat(unk, len(flat))), dtype=np.int64, count=len(flat))

        # Raw counts per order (invalid n-grams, e.g. <s> inside or </s> before the end, are dropped).
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for n in range(1, self.max_n + 1):
            sel = np.flatnonzero(orders == n)
            g = ids[starts[sel][:, None] + np.arange(n)]
            ok = ~((g[:, 1:] == 0).any(axis=1) | (g[:, :-1] == eos).any(axis=1) | (g[:, 0] == 0) & (n == 1))
            g = g[ok].astype(kdt)
            key = np.zeros(g.shape[0], dtype=np.int64).astype(kdt)
            for i in range(n):
                key = key * B + g[:, i]
            found[n] = (key, c[sel[ok]])
        keys: dict[int, np.ndarray] = {1: np.arange(1, B, dtype=np.int64)}
        raw: dict[int, np.ndarray] = {
            1: np.bincount(np.asarray(found[1][0], dtype=np.int64) - 1, weights=found[1][1], minlength=B - 1)
        }
        order = 1
        for n in range(2, self.max_n + 1):
            uk, inv = np.unique(found[n][0], return_inverse=True)
            s = np.bincount(inv.reshape(-1), weights=found[n][1], minlength=uk.size)
            keep = s > 0
            keys[n], raw[n] = uk[keep], s[keep]
            if keep.any():
                order = n
        self.order = order  # the highest order with a positive count
        N = order
        for n in range(N, 2, -1):  # close under prefixes and suffixes (orders >= 2; unigrams are complete)
            extra = np.concatenate([keys[n] // B, keys[n] % B ** (n - 1)])
            merged = np.union1d(keys[n - 1], extra)
            r = np.zeros(merged.size)
            r[np.searchsorted(merged, keys[n - 1])] = raw[n - 1]
            keys[n - 1], raw[n - 1] = merged, r

        # Adjusted counts: raw at the top order and for <s>-initial n-grams, continuation below.
        adj = {N: raw[N]}
        for n in range(N - 1, 0, -1):
            if partial:
                adj[n] = raw[n]
                continue
            idx = np.searchsorted(keys[n], keys[n + 1] % B**n)
            a = np.bincount(idx, weights=np.minimum(raw[n + 1], 1.0), minlength=keys[n].size)
            if n >= 2:
                bos = np.asarray(keys[n] // B ** (n - 1) == 0, dtype=bool)
                a[bos] = raw[n][bos]
            adj[n] = a
        if unk_mass is not None:
            adj[1] = adj[1].copy()
            adj[1][unk - 1] = 0.0

        # Discounts per order.
        if discount is None:
            disc = tuple(estimate_discounts(adj[n], self.modified) for n in range(1, N + 1))
        elif isinstance(discount, (int, float, np.integer, np.floating)) and not isinstance(discount, bool):
            disc = (_check_discount(discount, 1),) * N
        else:
            discount = list(discount)
            if len(discount) != self.max_n:
                raise ValueError(f"discount must have max_n = {self.max_n} entries, got {len(discount)}")
            disc = tuple(_check_discount(discount[n - 1], n) for n in range(1, N + 1))
        self.discounts: tuple[Discounts, ...] = disc

        # Unigrams: discounted continuation counts + the discount mass spread uniformly.
        a1 = adj[1]
        d1 = _discount(a1, disc[0])
        is_unk = np.arange(1, B) == unk
        n_uniform = B - 1 - (1 if unk_mass is not None else 0)
        tot = a1.sum()
        if tot > 0:
            p1 = (a1 - d1) / tot + (d1.sum() / tot) / n_uniform
        else:
            p1 = np.full(B - 1, 1.0 / n_uniform)
        if unk_mass is not None:
            p1 = np.where(is_unk, unk_mass, (1.0 - unk_mass) * p1)
        probs = {1: p1}
        gammas: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # order n: (context keys, γ)
        for n in range(2, N + 1):
            a = adj[n]
            d = _discount(a, disc[n - 1])
            ctx, inv = np.unique(keys[n] // B, return_inverse=True)
            inv = inv.reshape(-1)
            listed = np.bincount(inv, weights=a, minlength=ctx.size)
            tot = listed
            if partial:  # a context seen more often than its listed continuations: the rest backs off
                tot = np.maximum(listed, self._context_counts(keys, raw, n, ctx, eos))
            dsum = np.bincount(inv, weights=d, minlength=ctx.size)
            safe = np.where(tot > 0, tot, 1.0)
            gamma = np.where(tot > 0, (tot - listed + dsum) / safe, 1.0)
            alpha = np.where(tot[inv] > 0, (a - d) / safe[inv], 0.0)
            lower = probs[n - 1][np.searchsorted(keys[n - 1], keys[n] % B ** (n - 1))]
            probs[n] = alpha + gamma[inv] * lower
            gammas[n] = (ctx, gamma)

        # Back-off weights: bow(h) = γ(h) for the contexts of the next order, 1 elsewhere.
        self._bos_bow = None  # bow of the context <s> (None: not a context)
        bows, is_ctx = {}, {}
        for n in range(1, N + 1):
            bows[n], is_ctx[n] = np.ones(keys[n].size), np.zeros(keys[n].size, dtype=bool)
            if n == N:
                continue
            ctx, gamma = gammas[n + 1]
            if n == 1:
                if ctx.size and ctx[0] == 0:
                    self._bos_bow = float(gamma[0])
                    ctx, gamma = ctx[1:], gamma[1:]
                pos = np.asarray(ctx, dtype=np.int64) - 1
            else:
                pos = np.searchsorted(keys[n], ctx)
            bows[n][pos] = gamma
            is_ctx[n][pos] = True
        self._keys, self._probs, self._bows, self._is_ctx = keys, probs, bows, is_ctx
        self._index = {n: dict(zip(keys[n].tolist(), range(keys[n].size))) for n in range(1, N + 1)}
        self._vocabulary = frozenset(words[1:])

    @staticmethod
    def _context_counts(keys, raw, n: int, ctx: np.ndarray, eos: int) -> np.ndarray:
        """The count of each context (an (n−1)-gram item) of order n: its own item's count, and for
        the bare ``<s>`` (not an item) the number of sentences, c(</s>)."""
        if n == 2:  # unigram ids 1..B−1 sit at position id − 1; id 0 is <s>
            ids = np.asarray(ctx, dtype=np.int64)
            return np.where(ids == 0, raw[1][eos - 1], raw[1][np.maximum(ids, 1) - 1])
        out = np.zeros(ctx.size)
        pos = np.minimum(np.searchsorted(keys[n - 1], ctx), keys[n - 1].size - 1)
        found = keys[n - 1][pos] == ctx
        out[found] = raw[n - 1][pos[found]]
        return out

    # -- joint (smoothed) and next-word (unsmoothed) views ------------------------------------

    @cached_property
    def _joint(self) -> dict[tuple[str, ...], float]:
        sums: dict[tuple[str, ...], float] = {}
        for s, v in zip(self._items, self._item_counts.tolist()):
            g = tuple(s.split(" "))
            if len(g) <= self.max_n:
                sums[g] = sums.get(g, 0.0) + v
        totals = [0.0] * (self.max_n + 1)
        for g, v in sums.items():
            totals[len(g)] += v
        return {g: (v / totals[len(g)] if totals[len(g)] > 0 else 0.0) for g, v in sums.items()}

    @cached_property
    def _cond_joint(self) -> dict[tuple[str, ...], tuple[list[str], list[float]]]:
        groups: dict[tuple[str, ...], tuple[list[str], list[float]]] = {}
        for g, v in self._joint.items():
            if g == (BOS,) or v <= 0:
                continue
            ws, ps = groups.setdefault(g[:-1], ([], []))
            ws.append(g[-1])
            ps.append(v)
        return groups

    def prob(self, ngram: str | Sequence[str]) -> float:
        """Joint probability of ``ngram`` within its order under the smoothed model: its
        ``smoothed_joint`` (the model's probability of the n-gram as a word sequence),
        renormalised over the release's items of that order. The items of an order sum to 1 and
        every one is positive: an item whose count was clipped to 0 gets what back-off gives it,
        mass the discounts took from the others. 0.0 if ``ngram`` is not an item of the release."""
        g = _tokens(ngram)
        if not 1 <= len(g) <= self.max_n:
            raise ValueError(f"an n-gram has 1..{self.max_n} tokens, got {len(g)}")
        return self._smoothed_items[len(g)].get(g, 0.0)

    @cached_property
    def _raw_unigrams(self) -> np.ndarray:
        """P(w) over the word ids 1..B−1 from the raw unigram counts, discounted as the model's
        unigrams are (``estimate_discounts`` on the raw counts) with the discount mass spread
        uniformly: the marginal that starts ``smoothed_joint`` (continuation counts are not one)."""
        c = np.zeros(self._B - 1)
        for s, v in zip(self._items, self._item_counts.tolist()):
            if " " not in s and s != BOS:
                c[self._id(s) - 1] += v
        tot = c.sum()
        if tot <= 0:
            return np.full(c.size, 1.0 / c.size)
        d = _discount(c, estimate_discounts(c, self.modified))
        return (c - d) / tot + d.sum() / tot / c.size

    def smoothed_joint(self, ngrams: Sequence[str | Sequence[str]]) -> np.ndarray:
        """P(w₁ … w_n) = P(w₁) · Π P(w_i | w₁ … w_{i−1}) for each n-gram: P(w₁) from the raw unigram
        counts (``<s>`` as w₁: the share of sentence ends, one start per end), the conditionals
        from the smoothed model. Positive for every n-gram of vocabulary words (words outside it
        read as ``<unk>``); 0.0 for an n-gram that cannot occur (``<s>`` after the start, a word
        after ``</s>``)."""
        out = np.zeros(len(ngrams))
        p1, eos = self._raw_unigrams, self._wid[EOS]
        for i, ng in enumerate(ngrams):
            ids = [0 if t == BOS else self._id(t) for t in _tokens(ng)]
            if not ids or ids == [0] or 0 in ids[1:] or eos in ids[:-1]:
                continue
            p = float(p1[(eos if ids[0] == 0 else ids[0]) - 1])
            for k in range(1, len(ids)):
                p *= self._conditional_ids(ids[k], ids[max(0, k - (self.order - 1)) : k] if self.order > 1 else [])
            out[i] = p
        return out

    @cached_property
    def _smoothed_items(self) -> dict[int, dict[tuple[str, ...], float]]:
        """``prob`` of every item, by order; items read as the same word sequence (words outside
        the vocabulary) share its ``smoothed_joint`` in proportion to their counts."""
        by_order: dict[int, dict[tuple[str, ...], float]] = {n: {} for n in range(1, self.max_n + 1)}
        for s, v in zip(self._items, self._item_counts.tolist()):
            g = tuple(s.split(" "))
            if len(g) <= self.max_n:
                by_order[len(g)][g] = by_order[len(g)].get(g, 0.0) + v
        out: dict[int, dict[tuple[str, ...], float]] = {}
        for n, counts in by_order.items():
            grams = list(counts)
            if not grams:
                out[n] = {}
                continue
            c = np.fromiter(counts.values(), dtype=np.float64, count=len(grams))
            seq = np.array([[0 if t == BOS else self._id(t) for t in g] for g in grams], dtype=np.int64)
            _, inv = np.unique(seq, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            group_c, group_n = np.bincount(inv, weights=c), np.bincount(inv).astype(np.float64)
            share = np.where(group_c[inv] > 0, c / np.where(group_c > 0, group_c, 1.0)[inv], 1.0 / group_n[inv])
            q = self.smoothed_joint(grams) * share
            out[n] = dict(zip(grams, (q / q.sum() if q.sum() > 0 else q).tolist()))
        return out

    def next_word(self, context: list[str] | str, k: int = 10) -> list[tuple[str, float]]:
        """The k most probable next words after ``context`` (use ``<s>`` for a sentence start),
        with P(w | h) = c(h w) / Σ_v c(h v) for the longest suffix h of the context (≤ max_n − 1
        tokens) that has continuations with positive counts; unigrams if none has. Unsmoothed."""
        check_int(k, "k")
        found = self._cond_joint.get(self.context_used(context))
        if found is None:
            return []
        ws, ps = found
        p = np.asarray(ps)
        p = p / p.sum()
        top = np.argsort(-p, kind="stable")[:k]
        return [(ws[i], float(p[i])) for i in top.tolist()]

    def context_used(self, context: list[str] | str) -> tuple[str, ...]:
        """The suffix of ``context`` that ``next_word`` conditions on."""
        h = _tokens(context)
        h = h[len(h) - (self.max_n - 1) :] if self.max_n > 1 else ()
        while h not in self._cond_joint and h:
            h = h[1:]
        return h

    # -- smoothed model ----------------------------------------------------------------------

    @property
    def vocabulary(self) -> frozenset[str]:
        """Words the smoothed model knows, with ``</s>`` and ``<unk>`` (others read as ``<unk>``)."""
        return self._vocabulary

    def _id(self, w: str) -> int:
        j = self._wid.get(w)
        return j if j else self._wid[UNK]  # None, or 0 (<s> is not predicted) -> <unk>

    def _key(self, ids: Sequence[int]) -> int:
        key = 0
        for j in ids:
            key = key * self._B + j
        return key

    def _bow(self, ctx: list[int]) -> float:
        if ctx == [0]:
            return 1.0 if self._bos_bow is None else self._bos_bow
        i = self._index[len(ctx)].get(self._key(ctx))
        return 1.0 if i is None else float(self._bows[len(ctx)][i])

    def conditional(self, word: str, context: list[str] | str | tuple[str, ...] = ()) -> float:
        """P(word | context) under the smoothed model (words outside the vocabulary read as
        ``<unk>``; only the last order − 1 context tokens matter)."""
        h = [0 if t == BOS else self._id(t) for t in _tokens(context)]
        return self._conditional_ids(self._id(word), h[len(h) - (self.order - 1) :] if self.order > 1 else [])

    def _conditional_ids(self, w: int, h: list[int]) -> float:
        scale = 1.0
        for s in range(len(h) + 1):
            g = h[s:] + [w]
            i = self._index[len(g)].get(self._key(g))
            if i is not None:
                return scale * float(self._probs[len(g)][i])
            scale *= self._bow(h[s:])
        raise AssertionError("unreachable: every vocabulary word is a unigram")

    def perplexity(self, sentences: Iterable[Sequence[str] | str]) -> float:
        """exp(−mean log P) over every word and each sentence's ``</s>`` (empty sentences
        skipped) under the smoothed model; finite for any input (unless a unigram discount of 0
        was forced and a word without counts occurs: then inf)."""
        ids: list[str] = []
        starts: list[int] = []
        for s in sentences:
            words = _tokens(s)
            if words:
                starts.append(len(ids))
                ids.append(BOS)
                ids.extend(words)
                ids.append(EOS)
        if not starts:
            raise ValueError("no words to score")
        # a word's id as the word predicted, and as context (where <s> keeps its own id 0, as in ``conditional``)
        scored = np.fromiter(map(self._id, ids), dtype=np.int64, count=len(ids))
        context = np.where(np.array([w == BOS for w in ids]), 0, scored)
        probs = self._scored(scored, context, np.asarray(starts, dtype=np.int64))
        # summed in order with math.log, as one word at a time would: the same value to the last bit
        total = sum(math.log(p) if p > 0 else -math.inf for p in probs.tolist())
        return math.exp(-total / probs.size)

    def _scored(self, ids: np.ndarray, context: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """P(token | its context) of every token of ``ids`` but each sentence's leading ``<s>`` (``starts``: where
        the sentences begin; ``context``: the tokens' ids as context), equal to ``_conditional_ids`` token by token,
        looked up for all tokens at once."""
        k = self.order - 1
        first = np.zeros(ids.size, dtype=bool)
        first[starts] = True
        at = np.flatnonzero(~first)  # the scored tokens
        since = at - starts[np.searchsorted(starts, at, side="right") - 1]  # tokens of its sentence before it
        length = np.minimum(since, k)
        if self._keys[1].dtype == object:  # keys beyond int64: one token at a time
            return np.array(
                [self._conditional_ids(int(ids[t]), context[t - n : t].tolist()) for t, n in zip(at, length)]
            )
        out = np.empty(at.size)
        for n in np.unique(length).tolist():
            sel = np.flatnonzero(length == n)
            t = at[sel]
            h = context[t[:, None] + np.arange(-n, 0)]
            out[sel] = self._backoff(h, ids[t])
        return out

    def _lookup(self, grams: np.ndarray) -> np.ndarray:
        """Each row of ``grams`` (ids) as an item of its order: its position among that order's items, or -1."""
        n = grams.shape[1]
        key = np.zeros(grams.shape[0], dtype=np.int64)
        for i in range(n):
            key = key * self._B + grams[:, i]
        keys = self._keys[n]
        if keys.size == 0:
            return np.full(grams.shape[0], -1)
        pos = np.minimum(np.searchsorted(keys, key), keys.size - 1)
        return np.where(keys[pos] == key, pos, -1)

    def _bows_of(self, ctx: np.ndarray) -> np.ndarray:
        """``_bow`` of each row of ``ctx``."""
        if ctx.shape[1] == 0:
            return np.ones(ctx.shape[0])
        pos = self._lookup(ctx)
        out = np.where(pos >= 0, self._bows[ctx.shape[1]][np.maximum(pos, 0)], 1.0)
        if ctx.shape[1] == 1:
            out[ctx[:, 0] == 0] = 1.0 if self._bos_bow is None else self._bos_bow
        return out

    def _backoff(self, h: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``_conditional_ids`` of each word of ``w`` given its row of ``h`` (contexts of one length)."""
        p = np.empty(w.size)
        scale = np.ones(w.size)
        todo = np.arange(w.size)
        for s in range(h.shape[1] + 1):
            g = np.concatenate([h[todo, s:], w[todo, None]], axis=1)
            pos = self._lookup(g)
            hit = pos >= 0
            p[todo[hit]] = scale[todo[hit]] * self._probs[g.shape[1]][pos[hit]]
            todo = todo[~hit]
            if todo.size == 0:
                break
            scale[todo] *= self._bows_of(h[todo, s:])
        if todo.size:
            raise AssertionError("unreachable: every vocabulary word is a unigram")
        return p

    def write_arpa(self, path_or_file: str | os.PathLike | io.TextIOBase) -> None:
        """Write the back-off form as an ARPA file (log10 probabilities and back-off weights)."""
        if isinstance(path_or_file, (str, os.PathLike)):
            with atomic_file(Path(path_or_file)) as f:
                text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")
                self._write_arpa(text)
                text.flush()
                text.detach()
        else:
            self._write_arpa(path_or_file)

    def arpa(self) -> str:
        """The ARPA file as a string."""
        buf = io.StringIO()
        self._write_arpa(buf)
        return buf.getvalue()

    def _write_arpa(self, f) -> None:
        N, B = self.order, self._B
        words = np.array(self._words, dtype=object)

        def log10(x: np.ndarray) -> list[str]:
            with np.errstate(divide="ignore"):
                lg = np.log10(x)
            return [f"{v:.7f}" for v in np.where(np.isfinite(lg), lg, -99.0).tolist()]

        f.write("\n\\data\\\n")
        f.write(f"ngram 1={B}\n")
        for n in range(2, N + 1):
            f.write(f"ngram {n}={self._keys[n].size}\n")
        for n in range(1, N + 1):
            f.write(f"\n\\{n}-grams:\n")
            keys = self._keys[n]
            cols, rest = [], keys
            for _ in range(n):
                cols.append(np.asarray(rest % B, dtype=np.int64))
                rest = rest // B
            names = words[cols[-1]]
            for col in reversed(cols[:-1]):
                names = names + " " + words[col]
            lp = log10(self._probs[n])
            if n < N:
                bw = log10(self._bows[n])
                tails = ["\t" + b if ok else "" for b, ok in zip(bw, self._is_ctx[n].tolist())]
            else:
                tails = [""] * keys.size
            if n == 1:
                bos_tail = "" if self._bos_bow is None else "\t" + log10(np.array([self._bos_bow]))[0]
                f.write(f"-99.0000000\t{BOS}{bos_tail}\n")
            f.write("".join(f"{p}\t{g}{t}\n" for p, g, t in zip(lp, names.tolist(), tails)))
        f.write("\n\\end\\\n")

    @classmethod
    def from_release_file(cls, path: str | os.PathLike, max_n: int | None = None) -> NgramModel:
        """The model of an offline release ``.npz`` (``lac curator release --counts ... --out``),
        built by ``release_model`` as the curator builds it for the same release (from the
        file's ``pseudo_counts`` when it has them); ``max_n``: default its longest item."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            items = z["items"].tobytes().decode("utf-8").split("\n")
            pseudo = z["pseudo_counts"] if "pseudo_counts" in z.files else None
            return release_model(items, z["log_probs"], pseudo, max_n)


def release_model(
    items: Sequence[str],
    log_probs: np.ndarray | None,
    pseudo_counts: np.ndarray | None = None,
    max_n: int | None = None,
) -> NgramModel:
    """The language model of one release, the same on every route (the curator's queries, an
    offline release file, ``lac eval``): from the release's pseudo-counts when it has them (the
    posterior; exact counts), a release over part of the n-grams whose contexts' unlisted mass
    backs off (``from_counts(partial=True)``); else from the released distribution scaled by
    ``default_total``. ``max_n``: the release's longest n-gram (default: its longest item).
    ``log_probs`` may be None when ``pseudo_counts`` are given (they are not read then)."""
    items = list(items)
    if max_n is None:
        max_n = max((it.count(" ") + 1 for it in items), default=1)
    if pseudo_counts is not None:
        return NgramModel.from_counts(items, np.asarray(pseudo_counts, dtype=np.float64), max_n, partial=True)
    if log_probs is None:
        raise ValueError("a release model needs the release's log-probabilities or its pseudo-counts")
    return NgramModel(items, log_probs, max_n)
