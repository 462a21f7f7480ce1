"""The Localizer: replaces every word of a text by a metric-DP perturbed vocabulary word.

Per word w: y = φ(w) + z with z from the mechanism, output = the vocabulary word nearest
to y in Euclidean distance (exact search). Only perturbed tokens leave this module.

Out-of-vocabulary words are never passed through: all of them are mapped to one fixed,
public point, the embedding's centroid c, and perturbed from there like any word. Between
two OOV words the output is therefore exactly indistinguishable (distance 0); between an
OOV word and an in-vocabulary word w the per-word guarantee is ε·‖c − φ(w)‖.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from lac.common.rng import secure_generator
from lac.common.text import sentences as split_sentences
from lac.client.embedding import Embedding
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import NearestIndex

OOV = -1  # row id standing for "out of vocabulary" (perturbed from the centroid)
OOV_STATEMENT = ("out-of-vocabulary words are all perturbed from the embedding's centroid (a fixed public "
                 "point), never passed through, so they are mutually indistinguishable and, against a "
                 "vocabulary word w, protected at ε·d(centroid, w).")
_CHUNK = 1 << 16  # words per noise + nearest-neighbour pass (bounds memory, not speed)


@dataclass(frozen=True)
class PrivatizedReport:
    """What leaves the device: perturbed tokens plus the guarantee they carry."""

    sentences: tuple[tuple[str, ...], ...]
    n_words: int
    n_out_of_vocabulary: int
    mechanism: str
    epsilon_per_word: float
    embedding: str
    statement: str
    metadata: dict = field(default_factory=dict, compare=False)  # JSON-able guarantees and embedding facts


class Localizer:
    """Word-level metric-DP perturbation of texts over a fixed public ``embedding``.

    ``mechanism`` is either additive noise (``sample_noise``, e.g. ``MultivariateLaplace``;
    output = nearest word to φ(w) + noise) or a mechanism over the vocabulary offering
    ``sample_rows(points, rng)`` (``lac.client.truncated``, ``lac.client.modulated``); both
    provide ``name``, ``epsilon``, ``local_epsilon`` and ``statement``.
    """

    def __init__(self, embedding: Embedding, mechanism: MultivariateLaplace | object,
                 rng: np.random.Generator | None = None):
        self.embedding = embedding
        self.mechanism = mechanism
        self.rng = rng if rng is not None else secure_generator()
        self._index = NearestIndex(embedding.vectors, embedding.norms2)
        self.diameter = embedding.diameter()

    @property
    def search_backend(self) -> str:
        """Which exact nearest-word search runs: "fused" (compiled kernel) or "blas" (numpy fallback)."""
        return self._index.backend

    def ids(self, tokens: Iterable[str]) -> np.ndarray:
        """Rows of ``tokens`` (``OOV`` for words outside the vocabulary)."""
        index = self.embedding.index
        return np.fromiter((index.get(t, OOV) for t in tokens), dtype=np.int64)

    def perturb_ids(self, ids: np.ndarray) -> np.ndarray:
        """Perturb rows (``OOV`` = centroid) independently; returns output rows (int64)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ValueError("ids must be a 1-D integer array")
        ids = ids.astype(np.int64, copy=False)
        if ids.size and (ids.min() < OOV or ids.max() >= self.embedding.size):
            raise ValueError(f"ids must be in [{OOV}, {self.embedding.size})")
        out = np.empty(ids.size, dtype=np.int64)
        vectors, dim = self.embedding.vectors, self.embedding.dim
        for s in range(0, ids.size, _CHUNK):
            chunk = ids[s:s + _CHUNK]
            known = chunk != OOV
            points = np.empty((chunk.size, dim), dtype=np.float64)
            points[known] = vectors[chunk[known]]
            points[~known] = self.embedding.centroid
            if hasattr(self.mechanism, "sample_rows"):  # mechanisms over the vocabulary (truncated, modulated)
                out[s:s + _CHUNK] = self.mechanism.sample_rows(points, self.rng)
                continue
            points += self.mechanism.sample_noise(chunk.size, dim, self.rng)
            out[s:s + _CHUNK] = self._index.query(points)
        return out

    def local_epsilon(self, n_words: int) -> float:
        """Worst-case pure LDP level of an ``n_words`` report (n·ε·diameter)."""
        return self.mechanism.local_epsilon(n_words, self.diameter)

    def metric(self) -> str:
        """The per-word metric d_X under which the mechanism is ε·d_X-private."""
        return getattr(self.mechanism, "metric", "d(w,w') = ‖φ(w) − φ(w')‖₂")

    def composition(self, n_words: int) -> str:
        """Per-report composition: ℓ words, each ε·d_X-private with independent randomness."""
        n, eps, dx = int(n_words), self.mechanism.epsilon, self.metric()
        return (f"Report of ℓ = {n} words, each perturbed independently with ε = {eps:g} per word under "
                f"d_X = {dx}: ℓ words ⇒ ℓ·ε = {n * eps:g}. For texts x, x' of the same length ℓ and every "
                f"output y, Pr[M(x)=y] ≤ exp(ε·Σᵢ d_X(xᵢ,x'ᵢ))·Pr[M(x')=y] ≤ exp(ℓ·ε·maxᵢ d_X(xᵢ,x'ᵢ))·Pr[M(x')=y]. "
                f"The budget grows with the length of the text; ε is not a per-document guarantee.")

    def bag_statement(self, n_words: int) -> str:
        """Earth Mover's guarantee for bags of words of equal size (seed 003, Theorem 3.1)."""
        n, dx = int(n_words), self.metric()
        return (f"As a bag of words (order forgotten), against any other bag b' of the same size ℓ = {n}: "
                f"Pr[M(b) ∈ Z] ≤ exp(ℓ·ε·E(b,b'))·Pr[M(b') ∈ Z] for every set Z of output bags, with E the "
                f"Earth Mover's metric over d_X = {dx} (each word of mass 1/ℓ), so ℓ·E(b,b') = min over "
                f"one-to-one matchings σ of Σᵢ d_X(bᵢ, b'_σ(i)) (Fernandes, Dras & McIver, Thm 3.1: εℓE-privacy "
                f"for bags of equal size). Bags of different sizes are distinguishable by their size.")

    def statement(self, n_words: int) -> str:
        return (f"{self.mechanism.statement(n_words, diameter=self.diameter)} {self.composition(n_words)} "
                f"{self.bag_statement(n_words)} Embedding: {self.embedding.name} "
                f"({self.embedding.size} words, d = {self.embedding.dim}, diameter {self.diameter:.6g}); "
                f"{OOV_STATEMENT}")

    def metadata(self, n_words: int) -> dict:
        """Everything a report states about its privacy, as JSON-able fields."""
        emb = self.embedding
        return {
            "embedding": {"name": emb.name, "size": emb.size, "dim": emb.dim, "diameter": self.diameter,
                          "source": emb.source, "license": emb.license},
            "mechanism": self.mechanism.name, "epsilon_per_word": self.mechanism.epsilon,
            "metric": self.metric(), "n_words": int(n_words),
            "per_word_guarantee": self.mechanism.statement(n_words, diameter=self.diameter),
            "report_composition": self.composition(n_words),
            "report_epsilon_times_max_distance": int(n_words) * self.mechanism.epsilon,
            "bag_earth_movers": self.bag_statement(n_words),
            "local_epsilon_worst_case": self.local_epsilon(n_words),
            "out_of_vocabulary": OOV_STATEMENT,
            "nearest_neighbour": "exact Euclidean search (identical to float64 brute force)",
        }

    def privatize_many(self, texts: Iterable[str]) -> list[PrivatizedReport]:
        """Privatize each text (one report per text); all words share one vectorised pass."""
        tokenised = [split_sentences(t) for t in texts]
        flat = [tok for sents in tokenised for sent in sents for tok in sent]
        ids = self.ids(flat)
        words_out = self.embedding.words
        out_rows = self.perturb_ids(ids)
        reports, pos = [], 0
        for sents in tokenised:
            n = sum(len(s) for s in sents)
            rows = out_rows[pos:pos + n]
            n_oov = int(np.count_nonzero(ids[pos:pos + n] == OOV))
            perturbed, k = [], 0
            for s in sents:
                perturbed.append(tuple(words_out[r] for r in rows[k:k + len(s)]))
                k += len(s)
            pos += n
            reports.append(PrivatizedReport(
                sentences=tuple(perturbed), n_words=n, n_out_of_vocabulary=n_oov,
                mechanism=self.mechanism.name, epsilon_per_word=self.mechanism.epsilon,
                embedding=self.embedding.name, statement=self.statement(n), metadata=self.metadata(n)))
        return reports

    def privatize(self, text: str) -> PrivatizedReport:
        """Privatize one text."""
        return self.privatize_many([text])[0]
