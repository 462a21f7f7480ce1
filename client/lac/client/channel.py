"""The local channel: how often a Localizer turns each input word into each output word.

The word-level mechanism is public (the embedding, the mechanism and ε per word are in the
curator's published deployment), so its channel P(output word | input word) is public too. It
has no closed form for nearest-word decoding, so it is estimated by Monte Carlo: each input word
is perturbed ``draws`` times (one number for every input, or one per input) with the real mechanism
and the real exact nearest-word search, and the outputs are counted. Each estimated probability p
has standard error √(p(1−p)/draws) ≤ 0.5/√draws. Out-of-vocabulary inputs are perturbed from the
embedding's centroid, as on the device.

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
    (embedding rows, ascending) seen ``counts[...]`` times out of ``draws[i]``."""

    indptr: np.ndarray
    cols: np.ndarray
    counts: np.ndarray
    draws: np.ndarray  # per input


def sample_channel(
    embedding: Embedding,
    mechanism: LocalMechanism,
    rows: npt.ArrayLike,
    draws: int | npt.ArrayLike,
    rng: RandomSource | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ChannelCounts:
    """Output counts of ``draws`` perturbations of each input of ``rows`` (embedding rows, ``OOV``
    = -1 for the centroid; ``draws`` one number or one per input): one CSR row per input, summing
    to its draws. ``progress(done, total)`` is called before the first pass and after each pass with the
    perturbations done and to do."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if np.ndim(draws) == 0:
        per_row = np.full(rows.size, check_int(draws, "draws"), dtype=np.int64)
    else:
        per_row = np.asarray(draws, dtype=np.int64).reshape(-1)
        if per_row.shape != rows.shape or (per_row.size and per_row.min() < 1):
            raise ValueError(f"draws must be one positive number per row ({rows.size}), got shape {per_row.shape}")
    if rows.size and (rows.min() < OOV or rows.max() >= embedding.size):
        raise ValueError(f"rows must be embedding rows in [0, {embedding.size}) or {OOV} (out of vocabulary)")
    rng = secure_generator() if rng is None else rng
    index = NearestIndex(embedding.vectors, embedding.norms2)
    vectors, centroid = embedding.vectors, embedding.centroid
    ends = np.cumsum(per_row)
    total = int(ends[-1]) if rows.size else 0
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    cols, counts = [], []
    V = embedding.size
    if progress is not None:
        progress(0, total)  # the start: what a rate of progress is measured from
    lo = 0
    while lo < rows.size:  # passes of about CHUNK_POINTS perturbations (at least one input each)
        done = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, done + CHUNK_POINTS, side="right")))
        chunk, n_draws = rows[lo:hi], per_row[lo:hi]
        base = np.where((chunk == OOV)[:, None], centroid[None, :], vectors[np.maximum(chunk, 0)].astype(np.float64))
        points = np.repeat(base, n_draws, axis=0)
        out = np.asarray(mechanism.sample_outputs(points, index.query, rng), dtype=np.int64)
        keys, n = np.unique(np.repeat(np.arange(chunk.size, dtype=np.int64), n_draws) * V + out, return_counts=True)
        indptr[lo + 1 : hi + 1] = np.bincount(keys // V, minlength=chunk.size)
        cols.append(keys % V)
        counts.append(n.astype(np.int32))
        lo = hi
        if progress is not None:
            progress(int(ends[hi - 1]), total)
    np.cumsum(indptr, out=indptr)
    return ChannelCounts(
        indptr,
        np.concatenate(cols) if cols else np.empty(0, np.int64),
        np.concatenate(counts) if counts else np.empty(0, np.int32),
        per_row,
    )
