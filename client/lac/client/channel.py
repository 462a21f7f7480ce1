"""The local channel: how often a Localizer turns each input word into each output word.

The word-level mechanism is public (the embedding, the mechanism and ε per word are in the
curator's published deployment), so its channel P(output word | input word) is public too. It
has no closed form for nearest-word decoding, so it is estimated by Monte Carlo: each input word
is perturbed ``draws`` times with the real mechanism and the real exact nearest-word search, and
the outputs are counted. Each estimated probability p has standard error √(p(1−p)/draws) ≤
0.5/√draws. Out-of-vocabulary inputs are perturbed from the embedding's centroid, as on the device.

Nothing here reads private data: the curator uses the channel to estimate its users' clean
statistics from a DP release (post-processing, ``lac.curator.release.channel``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lac.client.embedding import Embedding
from lac.client.localizer import OOV
from lac.client.mechanisms import LocalMechanism
from lac.client.nearest import NearestIndex
from lac.common.checks import check_int
from lac.common.rng import RandomSource, secure_generator

__all__ = ["ChannelCounts", "sample_channel", "CHUNK_POINTS"]

CHUNK_POINTS = 1 << 17  # perturbed points per pass (bounds memory: ~50 MB at d = 50)


@dataclass(frozen=True)
class ChannelCounts:
    """Sparse output counts, CSR layout: input i's outputs are ``cols[indptr[i]:indptr[i+1]]``
    (embedding rows, ascending) seen ``counts[...]`` times out of ``draws``."""

    indptr: np.ndarray
    cols: np.ndarray
    counts: np.ndarray
    draws: int


def sample_channel(
    embedding: Embedding,
    mechanism: LocalMechanism,
    rows: npt.ArrayLike,
    draws: int,
    rng: RandomSource | None = None,
    progress: Callable[[int], None] | None = None,
) -> ChannelCounts:
    """Output counts of ``draws`` perturbations of each input of ``rows`` (embedding rows, ``OOV``
    = -1 for the centroid): one CSR row per input, each summing to ``draws``. ``progress(k)`` is
    called after every k inputs done."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    draws = check_int(draws, "draws")
    if rows.size and (rows.min() < OOV or rows.max() >= embedding.size):
        raise ValueError(f"rows must be embedding rows in [0, {embedding.size}) or {OOV} (out of vocabulary)")
    rng = secure_generator() if rng is None else rng
    index = NearestIndex(embedding.vectors, embedding.norms2)
    vectors, centroid = embedding.vectors, embedding.centroid
    per_chunk = max(1, CHUNK_POINTS // int(draws))
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    cols, counts = [], []
    V = embedding.size
    for lo in range(0, rows.size, per_chunk):
        chunk = rows[lo : lo + per_chunk]
        base = np.where((chunk == OOV)[:, None], centroid[None, :], vectors[np.maximum(chunk, 0)].astype(np.float64))
        points = np.repeat(base, draws, axis=0)
        out = np.asarray(mechanism.sample_outputs(points, index.query, rng), dtype=np.int64)
        keys, n = np.unique(np.repeat(np.arange(chunk.size, dtype=np.int64), draws) * V + out, return_counts=True)
        indptr[lo + 1 : lo + chunk.size + 1] = np.bincount(keys // V, minlength=chunk.size)
        cols.append(keys % V)
        counts.append(n.astype(np.int32))
        if progress is not None:
            progress(chunk.size)
    np.cumsum(indptr, out=indptr)
    return ChannelCounts(
        indptr,
        np.concatenate(cols) if cols else np.empty(0, np.int64),
        np.concatenate(counts) if counts else np.empty(0, np.int32),
        int(draws),
    )
