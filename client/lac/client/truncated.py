"""Truncated metric-DP word mechanisms (seed 002, §6 "Truncated Noise Mechanisms").

Both mechanisms here are exponential mechanisms *over the vocabulary* U: on input point x
(a word's vector, or the centroid for out-of-vocabulary words) they output word y with

    P(y | x) = exp(-(ε/2)·s(x, y)) / Z(x),      Z(x) = Σ_{u∈U} exp(-(ε/2)·s(x, u)),

for a truncated distance score s.  The probabilities are enumerated exactly (one float64
distance row per input, inverse-CDF sampling), so the output distribution is exactly the
stated one for the float64 distances it computes (GEMM form; absolute error ~1e-7 for
GloVe-sized vectors, which moves a weight by a factor within exp(±ε·1e-7)), and it is
tested by chi-square against the formula.

General lemma (used by both).  If |s(x,u) - s(x',u)| ≤ Δ(x,x') for every u, then for
every y:  P(y|x) / P(y|x') = exp(-(ε/2)(s(x,y) - s(x',y))) · Z(x')/Z(x) ≤ e^{εΔ/2}·e^{εΔ/2}
= e^{ε·Δ(x,x')}, because each term of Z(x') is at most e^{εΔ/2} times the same term of
Z(x).  The factor 2 in the exponent is the price of the normaliser Z(x), which (unlike
for translation-invariant Laplace noise) depends on the input.

``DistanceTruncated`` (§6 (1), admissible radius τ): s(x,y) = min(d(x,y), τ).  Words inside
the admissible area A(x) = {y : d(x,y) < τ} get weight exp(-ε·d/2); every word outside
gets the same weight exp(-ετ/2).  Equivalently: with probability
q(x) = |U∖A(x)|·e^{-ετ/2}/Z(x) the output is drawn *uniformly* from U∖A(x) (the seed's
"residual probability ... randomly drawn from U - A"), otherwise from A(x) with probability
∝ exp(-ε·d(x,y)/2).  Since t ↦ min(t, τ) is 1-Lipschitz and takes values in [0, τ],
|s(x,u) - s(x',u)| ≤ min(d(x,x'), τ), so by the lemma

    P(y|x) ≤ exp(ε·min(d(x,x'), τ)) · P(y|x')   for all x, x', y:

ε·d metric DP *and* pure ετ-LDP per word whatever the vocabulary's diameter.  (Giving the
residual words one shared "⊥" weight and then a uniform word, as in Carvalho et al.'s TEM,
makes each outside word's probability depend on |U∖A(x)|, which the lemma does not cover;
we weight the outside words individually instead.)

``KNNTruncated`` (§6 (2), k nearest words): s(x,y) = min(d(x,y), r_k(x)), with r_k(x) the
distance from x to its k-th nearest vocabulary word (x's own word counts, at distance 0).
The k nearest words get weight exp(-ε·d/2), all others the residual weight
exp(-ε·r_k(x)/2) each.  r_k is 1-Lipschitz (the k words within r_k(x) of x are within
r_k(x) + d(x,x') of x'), so s(·,y) is 1-Lipschitz as a minimum of 1-Lipschitz functions:
|s(x,u) - s(x',u)| ≤ d(x,x').  Also 0 ≤ s(x,u) ≤ r_k(x), so the difference is at most
max(r_k(x), r_k(x')) ≤ R_k = max over inputs of r_k.  By the lemma

    P(y|x) ≤ exp(ε·min(d(x,x'), max(r_k(x), r_k(x')))) · P(y|x') ≤ exp(ε·min(d(x,x'), R_k)) · P(y|x').

Outputting *only* among the k nearest words would not be metric DP at all (a word among
x's neighbours but not among x''s has probability 0 under x'), hence the residual mass.

Inputs are the vocabulary's vectors and the centroid (for OOV words); the centroid lies in
the convex hull of the vocabulary, so its distance to any word is at most the diameter.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from lac.client.embedding import Embedding
from lac.client.mechanisms import Nearest, RowArray
from lac.common.checks import check_int
from lac.common.privacy import check_epsilon
from lac.common.rng import FloatArray, RandomSource

_ENTRIES = 1 << 22  # distance-matrix entries per block


class VocabularyMechanism:
    """An exponential mechanism over the rows of ``embedding`` with score ``score(points, dist)``.

    A ``LocalMechanism`` (its subclasses, which define ``scores`` and ``statement``): instead of
    ``sample_noise`` it offers ``sample_rows(points, rng)``.
    """

    name = "vocabulary-exponential"

    def __init__(self, embedding: Embedding, epsilon: float):
        self.embedding = embedding
        self.epsilon = check_epsilon(epsilon)
        self._v = np.asarray(embedding.vectors, dtype=np.float64)
        self._n2 = np.einsum("ij,ij->i", self._v, self._v)

    @property
    def metric(self) -> str:
        """The per-word metric d_X of the guarantee (a truncated d is still a metric)."""
        return "‖φ(w) − φ(w')‖₂"

    # -- exact distances and probabilities --------------------------------------------------
    def distances(self, points: npt.ArrayLike) -> FloatArray:
        """Euclidean distances (float64) from each point to every vocabulary row, shape (m, V)."""
        p = np.asarray(points, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != self.embedding.dim:
            raise ValueError(f"points must have shape (m, {self.embedding.dim}), got {p.shape}")
        d2 = np.einsum("ij,ij->i", p, p)[:, None] - 2.0 * (p @ self._v.T) + self._n2[None, :]
        np.maximum(d2, 0.0, out=d2)
        out: FloatArray = np.sqrt(d2, out=d2)
        return out

    def scores(self, dist: FloatArray) -> FloatArray:  # pragma: no cover - abstract
        """The truncated score s(x, y) for a distance matrix (may overwrite ``dist``)."""
        raise NotImplementedError

    def statement(self, n_words: int, diameter: float | None = None) -> str:  # pragma: no cover - abstract
        """The guarantee, per word and composed over a report of ``n_words`` words."""
        raise NotImplementedError

    def log_weights(self, points: npt.ArrayLike) -> FloatArray:
        """Unnormalised log-probabilities -(ε/2)·s(x, y), shape (m, V)."""
        return -0.5 * self.epsilon * self.scores(self.distances(points))

    def probabilities(self, points: npt.ArrayLike) -> FloatArray:
        """The exact output distribution P(y | x) for each point, shape (m, V)."""
        lw = self.log_weights(points)
        lw -= lw.max(axis=1, keepdims=True)
        w = np.exp(lw)
        out: FloatArray = w / w.sum(axis=1, keepdims=True)
        return out

    def sample_rows(self, points: npt.ArrayLike, rng: RandomSource) -> RowArray:
        """One output row per point (int64), by inverse CDF over the enumerated probabilities."""
        p = np.asarray(points, dtype=np.float64)
        out = np.empty(p.shape[0], dtype=np.int64)
        size = self.embedding.size
        block = max(1, _ENTRIES // size)
        for s in range(0, p.shape[0], block):
            lw = self.log_weights(p[s : s + block])
            lw -= lw.max(axis=1, keepdims=True)
            np.exp(lw, out=lw)
            np.cumsum(lw, axis=1, out=lw)
            u = rng.random(lw.shape[0]) * lw[:, -1]
            idx = np.count_nonzero(lw <= u[:, None], axis=1)  # first j with cum[j] > u
            out[s : s + block] = np.minimum(idx, size - 1)
        return out

    def sample_outputs(self, points: FloatArray, nearest: Nearest, rng: RandomSource) -> RowArray:
        """``sample_rows``: the output is drawn over the vocabulary, so ``nearest`` is not used."""
        return self.sample_rows(points, rng)

    def sample_ids(self, ids: npt.ArrayLike, rng: RandomSource) -> RowArray:
        """Rows for vocabulary ids (``-1`` = the centroid)."""
        ids = np.asarray(ids, dtype=np.int64)
        pts = np.empty((ids.size, self.embedding.dim))
        known = ids >= 0
        pts[known] = self._v[ids[known]]
        pts[~known] = self.embedding.centroid
        return self.sample_rows(pts, rng)

    # -- guarantee ---------------------------------------------------------------------------
    def per_word_bound(self, diameter: float) -> float:
        """The largest per-word distance term: min(diameter, truncation)."""
        return float(diameter)

    def local_epsilon(self, n_words: int, diameter: float) -> float:
        """Worst-case pure LDP level of an ``n_words`` report: n·ε·min(diameter, truncation)."""
        n = int(n_words)
        if n < 0:
            raise ValueError("n_words must be >= 0")
        return n * self.epsilon * self.per_word_bound(diameter)


class DistanceTruncated(VocabularyMechanism):
    """Distance-truncated exponential mechanism with admissible radius ``tau`` (see module doc)."""

    name = "distance-truncated"

    def __init__(self, embedding: Embedding, epsilon: float, tau: float):
        super().__init__(embedding, epsilon)
        tau = float(tau)
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be finite and > 0, got {tau!r}")
        self.tau = tau

    def scores(self, dist: FloatArray) -> FloatArray:
        """min(d, τ), in place."""
        out: FloatArray = np.minimum(dist, self.tau, out=dist)
        return out

    @property
    def metric(self) -> str:
        """d truncated at τ."""
        return f"min(‖φ(w) − φ(w')‖₂, τ = {self.tau:g})"

    def per_word_bound(self, diameter: float) -> float:
        """min(diameter, τ)."""
        return min(float(diameter), self.tau)

    def statement(self, n_words: int, diameter: float | None = None) -> str:
        """The guarantee, per word and composed over a report of ``n_words`` words."""
        n, eps, tau = int(n_words), self.epsilon, self.tau
        worst = (
            f"ε0 = n·ε·min(diam, τ) = {n}·{eps:g}·{self.per_word_bound(diameter):.6g} = "
            f"{self.local_epsilon(n, diameter):.6g}"
            if diameter is not None
            else f"ε0 = {n}·{eps:g}·{tau:g}"
        )
        return (
            f"Metric DP ({self.name}: exponential mechanism over the vocabulary, P(y|x) ∝ "
            f"exp(-(ε/2)·min(d(x,y), τ)), ε = {eps:g}, τ = {tau:g}; words farther than τ share "
            f"the residual weight uniformly): for all words w, w' and every output y, "
            f"Pr[M(w)=y] ≤ exp(ε·min(d(w,w'), τ))·Pr[M(w')=y] (the factor 1/2 in the exponent "
            f"pays for the input-dependent normaliser). A report of n = {n} words composes: "
            f"Pr[M(x)=y] ≤ exp(ε·Σᵢ min(d(xᵢ,x'ᵢ), τ))·Pr[M(x')=y]; worst case pure local DP with "
            f"{worst}. The number of words and the sentence boundaries are not hidden."
        )


class KNNTruncated(VocabularyMechanism):
    """k-nearest-neighbour truncated exponential mechanism (see module doc)."""

    name = "knn-truncated"

    def __init__(self, embedding: Embedding, epsilon: float, k: int):
        super().__init__(embedding, epsilon)
        self.k = check_int(k, "k", 1, embedding.size)
        self._r_max: float | None = None

    def radius(self, dist: FloatArray) -> FloatArray:
        """r_k(x) for each row of a distance matrix."""
        out: FloatArray = np.partition(dist, self.k - 1, axis=1)[:, self.k - 1]
        return out

    def scores(self, dist: FloatArray) -> FloatArray:
        """min(d, r_k(x)), in place."""
        r = self.radius(dist)
        out: FloatArray = np.minimum(dist, r[:, None], out=dist)
        return out

    def max_radius(self) -> float:
        """R_k = max of r_k over the vocabulary and the centroid (exact, computed once, blocked)."""
        if self._r_max is None:
            v = self._v
            best = float(self.radius(self.distances(self.embedding.centroid[None, :]))[0])
            block = max(1, _ENTRIES // self.embedding.size)
            for s in range(0, v.shape[0], block):
                best = max(best, float(self.radius(self.distances(v[s : s + block])).max()))
            self._r_max = best
        return self._r_max

    def per_word_bound(self, diameter: float) -> float:
        """min(diameter, R_k)."""
        return min(float(diameter), self.max_radius())

    @property
    def metric(self) -> str:
        """d truncated at R_k."""
        return f"min(‖φ(w) − φ(w')‖₂, R_k = {self.max_radius():.6g})"

    def statement(self, n_words: int, diameter: float | None = None) -> str:
        """The guarantee, per word and composed over a report of ``n_words`` words."""
        n, eps, k = int(n_words), self.epsilon, self.k
        r = self.max_radius()
        worst = (
            f"ε0 = n·ε·min(diam, R_k) = {n}·{eps:g}·{self.per_word_bound(diameter):.6g} = "
            f"{self.local_epsilon(n, diameter):.6g}"
            if diameter is not None
            else f"ε0 = {n}·{eps:g}·{r:.6g}"
        )
        return (
            f"Metric DP ({self.name}: exponential mechanism over the vocabulary, P(y|x) ∝ "
            f"exp(-(ε/2)·min(d(x,y), r_k(x))), r_k(x) = distance to the k-th nearest word, "
            f"ε = {eps:g}, k = {k}; words beyond the k nearest share the residual weight uniformly): "
            f"for all words w, w' and every output y, Pr[M(w)=y] ≤ exp(ε·min(d(w,w'), R_k))·Pr[M(w')=y] "
            f"with R_k = max r_k = {r:.6g}. A report of n = {n} words composes additively; worst case "
            f"pure local DP with {worst}. The number of words and the sentence boundaries are not hidden."
        )


def default_tau(embedding: Embedding, k: int = 10, sample: int = 500) -> float:
    """A public default radius: the median distance to the k-th nearest other word over an
    evenly spaced sample of rows (a property of the public embedding only)."""
    rows = np.unique(np.linspace(0, embedding.size - 1, min(sample, embedding.size)).astype(np.int64))
    m = VocabularyMechanism(embedding, 1.0)
    d = m.distances(m._v[rows])
    kk = min(k, embedding.size - 1)
    return float(np.median(np.partition(d, kk, axis=1)[:, kk]))
