"""Local metric-DP mechanisms for word embeddings: the ``LocalMechanism`` protocol the Localizer
runs, and additive multivariate Laplace noise (the vocabulary mechanisms are in ``truncated`` and
``modulated``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from lac.common.checks import check_int
from lac.common.privacy import check_epsilon
from lac.common.rng import FloatArray, RandomSource

if TYPE_CHECKING:  # pragma: no cover
    from lac.client.embedding import Embedding

RowArray: TypeAlias = npt.NDArray[np.int64]
Nearest: TypeAlias = Callable[[FloatArray], RowArray]


@runtime_checkable
class LocalMechanism(Protocol):
    """A per-word ε·d metric-DP mechanism as the Localizer uses it.

    ``sample_outputs(points, nearest, rng)`` gives one output vocabulary row per input point (a
    word's vector, or the centroid for out-of-vocabulary words). ``nearest`` is the Localizer's
    exact nearest-word search: additive mechanisms apply it to the noisy points, mechanisms over
    the vocabulary sample rows directly and ignore it.
    """

    @property
    def name(self) -> str:
        """The mechanism's id, as a deployment names it."""
        ...

    @property
    def epsilon(self) -> float:
        """ε per word."""
        ...

    @property
    def metric(self) -> str:
        """The per-word metric d_X of the guarantee, in words."""
        ...

    def local_epsilon(self, n_words: int, diameter: float) -> float:
        """Worst-case pure LDP level of an ``n_words`` report over an embedding of this diameter."""
        ...

    def statement(self, n_words: int, diameter: float | None = None) -> str:
        """The guarantee, per word and composed over a report of ``n_words`` words."""
        ...

    def sample_outputs(self, points: FloatArray, nearest: Nearest, rng: RandomSource) -> RowArray:
        """One output row (int64) per row of ``points``."""
        ...


@dataclass(frozen=True)
class MultivariateLaplace:
    """Multivariate Laplace noise in R^d with density proportional to exp(-ε‖z‖₂).

    Sampled as radius ~ Gamma(shape=d, scale=1/ε) times a direction uniform on the unit
    sphere (Fernandes, Dras & McIver, Algorithm 1), one independent radius per vector.

    Guarantee (metric DP, per word): adding this noise to φ(w) and post-processing (e.g.
    mapping to the nearest vocabulary word) satisfies, for all words w, w' and outputs y,
    Pr[M(w)=y] ≤ exp(ε·d(w,w'))·Pr[M(w')=y] with d(w,w') = ‖φ(w) − φ(w')‖₂. Valid for every
    finite ε > 0 and any embedding φ. Independent noise on the n words of a report composes
    to ε·Σᵢ d(xᵢ,x'ᵢ) ≤ n·ε·diam, i.e. pure (n·ε·diam)-LDP in the worst case.
    """

    epsilon: float
    name: ClassVar[str] = "multivariate-laplace"
    metric: ClassVar[str] = "‖φ(w) − φ(w')‖₂"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def sample_noise(self, n: int, dim: int, rng: RandomSource) -> FloatArray:
        """``n`` independent noise vectors of dimension ``dim`` (float64, shape (n, dim))."""
        n = check_int(n, "n", minimum=0)
        dim = check_int(dim, "dim", minimum=0)
        if dim == 0:
            raise ValueError("dim must be >= 1")
        radius = rng.gamma(shape=dim, scale=1.0 / self.epsilon, size=n)
        z = rng.standard_normal((n, dim))
        norm = np.sqrt(np.einsum("ij,ij->i", z, z))
        zero = np.flatnonzero(norm == 0.0)
        while zero.size:  # only plausible for tiny dim; keeps the direction exactly uniform
            z[zero] = rng.standard_normal((zero.size, dim))
            norm[zero] = np.sqrt(np.einsum("ij,ij->i", z[zero], z[zero]))
            zero = zero[norm[zero] == 0.0]
        z *= (radius / norm)[:, None]
        return z

    def sample_outputs(self, points: FloatArray, nearest: Nearest, rng: RandomSource) -> RowArray:
        """The words nearest to ``points`` + noise (``points`` is overwritten)."""
        points += self.sample_noise(points.shape[0], points.shape[1], rng)
        return nearest(points)

    def local_epsilon(self, n_words: int, diameter: float) -> float:
        """Worst-case pure LDP level of an ``n_words`` report: ε0 = n_words·ε·diameter."""
        return check_int(n_words, "n_words", minimum=0) * self.epsilon * float(diameter)

    def statement(self, n_words: int, diameter: float | None = None) -> str:
        """The guarantee, per word and composed over a report of ``n_words`` words."""
        n = check_int(n_words, "n_words", minimum=0)
        eps = self.epsilon
        worst = (
            f"ε0 = n·ε·diam = {n}·{eps:g}·{diameter:.6g} = {self.local_epsilon(n, diameter):.6g}"
            if diameter is not None
            else f"ε0 = {n}·{eps:g}·diam(vocabulary)"
        )
        return (
            f"Metric DP ({self.name}, noise density ∝ exp(-ε‖z‖), ε = {eps:g} per word; d = Euclidean "
            f"distance between word embeddings): for all words w, w' and every output y, "
            f"Pr[M(w)=y] ≤ exp(ε·d(w,w'))·Pr[M(w')=y]. "
            f"This report has n = {n} words, each perturbed with independent noise; for inputs x, x' "
            f"of the same length, Pr[M(x)=y] ≤ exp(ε·Σᵢ d(xᵢ,x'ᵢ))·Pr[M(x')=y] ≤ exp({n}·{eps:g}·maxᵢ d(xᵢ,x'ᵢ)); "
            f"worst case pure local DP with {worst}. The number of words and the sentence "
            f"boundaries are not hidden."
        )


# -- the registry of local mechanisms ------------------------------------------------------------


@dataclass(frozen=True)
class LocalKind:
    """One local mechanism as the SDK's commands choose it: ``option`` (the CLI's ``--mechanism`` value),
    ``name`` (the mechanism's own, as a deployment names it: ``lac.common.deployment.LOCAL_MECHANISMS``), a line
    for ``--help``, and ``build(embedding, tau, k, sigma)``: ``ε -> mechanism`` over that embedding (``tau``,
    ``k``, ``sigma``: the options of the mechanisms that take them, None for their defaults)."""

    option: str
    name: str
    summary: str
    build: Callable[..., Callable[[float], LocalMechanism]]


def _laplace(
    embedding: Embedding, tau: float | None = None, k: int | None = None, sigma: float | None = None
) -> Callable[[float], LocalMechanism]:
    return MultivariateLaplace


def _truncated(
    embedding: Embedding, tau: float | None = None, k: int | None = None, sigma: float | None = None
) -> Callable[[float], LocalMechanism]:
    from lac.client.truncated import DistanceTruncated, default_tau

    t = default_tau(embedding) if tau is None else tau
    return lambda eps: DistanceTruncated(embedding, eps, t)


def _knn(
    embedding: Embedding, tau: float | None = None, k: int | None = None, sigma: float | None = None
) -> Callable[[float], LocalMechanism]:
    from lac.client.truncated import KNNTruncated

    return lambda eps: KNNTruncated(embedding, eps, 20 if k is None else k)


def _modulated(
    embedding: Embedding, tau: float | None = None, k: int | None = None, sigma: float | None = None
) -> Callable[[float], LocalMechanism]:
    from lac.client.modulated import DensityModulated

    return lambda eps: DensityModulated(embedding, eps, sigma=sigma)


LOCAL_KINDS: dict[str, LocalKind] = {
    kind.option: kind
    for kind in (
        LocalKind("laplace", "multivariate-laplace", "multivariate Laplace + exact nearest word", _laplace),
        LocalKind("truncated", "distance-truncated", "distance-truncated (--tau)", _truncated),
        LocalKind("knn", "knn-truncated", "kNN-truncated (--k)", _knn),
        LocalKind("modulated", "density-modulated", "density-modulated", _modulated),
    )
}


def local_kind(option: str) -> LocalKind:
    """The registered local mechanism of a ``--mechanism`` value (ValueError naming the known ones)."""
    try:
        return LOCAL_KINDS[option]
    except KeyError:
        raise ValueError(f"unknown mechanism {option!r}; known: {', '.join(LOCAL_KINDS)}") from None


def local_kinds_help() -> str:
    """The ``--mechanism`` help line: every registered kind and what it is."""
    return "; ".join(f"{kind.option}: {kind.summary}" for kind in LOCAL_KINDS.values())
