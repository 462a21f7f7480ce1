"""Calibrating ε by plausible-deniability statistics (Feyisetan et al.'s N_w and S_w).

For a word w and ``K`` independent perturbations M(w):

* ``N_w`` -- the fraction of draws that return w itself (an estimate of Pr[M(w) = w]);
* ``S_w`` -- the number of distinct outputs among the K draws;
* ``nn10`` -- the fraction of draws that land on one of w's 10 nearest *other* vocabulary
  words (exact Euclidean neighbours, w itself excluded): how often a change stays close.

Low N_w / high S_w means more plausible deniability; these are empirical proxies, not
privacy guarantees (the guarantee is the mechanism's ``statement``).  Everything is
vectorised: each word's id is repeated K times and passed to ``Localizer.perturb_ids`` in
one batch.  Words are either chosen (``words=``) or drawn uniformly from frequency bands of
the public vocabulary (rank ranges; rows are in frequency order), never from user data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from lac.client.embedding import Embedding
from lac.client.localizer import Localizer
from lac.client.mechanisms import LocalMechanism, local_kind
from lac.client.nearest import sqdist64
from lac.common.progress import Progress
from lac.common.rng import RandomSource

N_NEIGHBOURS = 10
_DRAWS_PER_BATCH = 1 << 15


def default_bands(size: int) -> list[tuple[int, int]]:
    """Rank bands [0,100), [100,1k), [1k,10k), [10k,100k) ... cut at the vocabulary size."""
    bands, lo, hi = [], 0, 100
    while lo < size:
        bands.append((lo, min(hi, size)))
        lo, hi = hi, hi * 10
    return bands


def band_label(band: tuple[int, int]) -> str:
    """ "lo-hi" for a rank band."""
    return f"{band[0]}-{band[1]}"


def nearest_neighbours(embedding: Embedding, ids: npt.ArrayLike, k: int = N_NEIGHBOURS) -> np.ndarray:
    """The ``k`` nearest other rows of each id, shape (n, k), nearest first.

    Candidates come from a float64 GEMM (k + 8 per word), re-ranked with the reference
    formula ``sqdist64``; ties go to the lower row.
    """
    ids = np.asarray(ids, dtype=np.int64)
    k = min(k, embedding.size - 1)
    v = np.asarray(embedding.vectors, dtype=np.float64)
    n2 = np.einsum("ij,ij->i", v, v)
    c = min(k + 8, embedding.size)
    out = np.empty((ids.size, k), dtype=np.int64)
    step = max(1, (1 << 22) // embedding.size)
    for s in range(0, ids.size, step):
        blk = ids[s : s + step]
        d = n2[None, :] - 2.0 * (v[blk] @ v.T)
        d[np.arange(blk.size), blk] = np.inf
        cand = np.argpartition(d, c - 1, axis=1)[:, :c] if c < embedding.size else np.argsort(d, axis=1)[:, :c]
        cd = sqdist64(v[blk][:, None, :], v[cand])
        cd[cand == blk[:, None]] = np.inf
        order = np.lexsort((cand, cd), axis=1)
        out[s : s + step] = np.take_along_axis(cand, order, axis=1)[:, :k]
    return out


@dataclass
class WordStats:
    """Per-word audit statistics of a Localizer over ``draws`` perturbations of each word."""

    ids: np.ndarray  # rows audited
    n_w: np.ndarray  # fraction unchanged
    s_w: np.ndarray  # distinct outputs in K draws
    nn10: np.ndarray  # fraction among the 10 nearest other words
    draws: int


def word_stats(
    localizer: Localizer,
    ids: npt.ArrayLike,
    draws: int,
    progress: Progress | None = None,
    neighbours: np.ndarray | None = None,
) -> WordStats:
    """N_w, S_w and the nn10 share of each row in ``ids`` from ``draws`` perturbations each."""
    ids = np.asarray(ids, dtype=np.int64)
    if draws < 1:
        raise ValueError("draws must be >= 1")
    if neighbours is None:
        neighbours = nearest_neighbours(localizer.embedding, ids)
    n_w = np.empty(ids.size)
    s_w = np.empty(ids.size, dtype=np.int64)
    nn = np.empty(ids.size)
    per = max(1, _DRAWS_PER_BATCH // draws)
    for s in range(0, ids.size, per):
        blk = ids[s : s + per]
        out = localizer.perturb_ids(np.repeat(blk, draws)).reshape(blk.size, draws)
        n_w[s : s + per] = (out == blk[:, None]).mean(axis=1)
        srt = np.sort(out, axis=1)
        s_w[s : s + per] = 1 + np.count_nonzero(srt[:, 1:] != srt[:, :-1], axis=1)
        nb = neighbours[s : s + per]
        nn[s : s + per] = (out[:, :, None] == nb[:, None, :]).any(axis=2).mean(axis=1)
        if progress is not None:
            progress.update(blk.size)
    return WordStats(ids, n_w, s_w, nn, draws)


@dataclass
class CalibrationRow:
    """The audit statistics of one ε: over all chosen words, per rank band and (optionally) per word."""

    epsilon: float
    median_n_w: float
    mean_n_w: float
    median_s_w: float
    mean_nn10: float
    # label -> {"median_n_w", "median_s_w", "mean_nn10", "words"}
    bands: dict[str, dict[str, float]] = field(default_factory=dict)
    words: dict[str, dict[str, float]] = field(default_factory=dict)  # word -> {"n_w", "s_w", "nn10"} (chosen only)

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-able fields."""
        return {
            "epsilon": self.epsilon,
            "median_n_w": self.median_n_w,
            "mean_n_w": self.mean_n_w,
            "median_s_w": self.median_s_w,
            "mean_nn10": self.mean_nn10,
            "bands": self.bands,
            "words": self.words,
        }


def choose_words(
    embedding: Embedding, per_band: int, rng: RandomSource, bands: list[tuple[int, int]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows drawn uniformly without replacement from each rank band; returns (ids, band index)."""
    bands = bands or default_bands(embedding.size)
    ids, which = [], []
    for b, (lo, hi) in enumerate(bands):
        n = min(per_band, hi - lo)
        ids.append(np.sort(rng.choice(np.arange(lo, hi), size=n, replace=False)))
        which.append(np.full(n, b))
    return np.concatenate(ids), np.concatenate(which)


def calibrate(
    embedding: Embedding,
    mechanism_for: Callable[[float], LocalMechanism],
    epsilons: Sequence[float],
    ids: npt.ArrayLike,
    draws: int,
    rng: RandomSource,
    *,
    bands: Sequence[tuple[int, int]] | None = None,
    band_of: np.ndarray | None = None,
    report_words: bool = False,
    progress: bool = True,
) -> list[CalibrationRow]:
    """One ``CalibrationRow`` per ε: statistics over ``ids`` and, if given, per band."""
    ids = np.asarray(ids, dtype=np.int64)
    neighbours = nearest_neighbours(embedding, ids)
    rows = []
    for eps in epsilons:
        loc = Localizer(embedding, mechanism_for(float(eps)), rng, calibrated=True)  # this is the calibration
        bar = Progress(f"ε={eps:g}", ids.size) if progress else None
        st = word_stats(loc, ids, draws, bar, neighbours)
        if bar is not None:
            bar.close()
        row = CalibrationRow(
            float(eps), float(np.median(st.n_w)), float(st.n_w.mean()), float(np.median(st.s_w)), float(st.nn10.mean())
        )
        if bands is not None and band_of is not None:
            for b, band in enumerate(bands):
                m = band_of == b
                if m.any():
                    row.bands[band_label(band)] = {
                        "median_n_w": float(np.median(st.n_w[m])),
                        "median_s_w": float(np.median(st.s_w[m])),
                        "mean_nn10": float(st.nn10[m].mean()),
                        "words": int(m.sum()),
                    }
        if report_words:
            for i, r in enumerate(ids):
                row.words[embedding.words[r]] = {
                    "n_w": float(st.n_w[i]),
                    "s_w": int(st.s_w[i]),
                    "nn10": float(st.nn10[i]),
                }
        rows.append(row)
    return rows


def recommend(rows: Sequence[CalibrationRow], target: float = 0.5, stat: str = "median_n_w") -> float | None:
    """The largest ε of the grid whose ``stat`` (median N_w by default) is ≤ ``target``, else None.

    N_w grows with ε (less noise), so this is the least-noise setting meeting the target
    within the grid; it is an estimate from finitely many draws.
    """
    ok = [r.epsilon for r in rows if getattr(r, stat) <= target]
    return max(ok) if ok else None


def format_table(rows: Sequence[CalibrationRow], draws: int) -> str:
    """The calibration as a text table: one line per ε, then the per-word lines if any."""
    band_labels = list(rows[0].bands) if rows else []
    head = (
        ["ε", "med N_w", "mean N_w", f"med S_w/{draws}", "nn10"]
        + [f"N_w[{b}]" for b in band_labels]
        + [f"S_w[{b}]" for b in band_labels]
    )
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        cells = (
            [f"{r.epsilon:g}", f"{r.median_n_w:.3f}", f"{r.mean_n_w:.3f}", f"{r.median_s_w:g}", f"{r.mean_nn10:.3f}"]
            + [f"{r.bands[b]['median_n_w']:.3f}" for b in band_labels]
            + [f"{r.bands[b]['median_s_w']:g}" for b in band_labels]
        )
        lines.append("  ".join(f"{c:>12}" for c in cells))
    words = rows[0].words if rows else {}
    lines.extend(
        f"  {w}: "
        + ", ".join(
            f"ε={r.epsilon:g}: N_w={r.words[w]['n_w']:.3f} S_w={r.words[w]['s_w']} nn10={r.words[w]['nn10']:.3f}"
            for r in rows
        )
        for w in words
    )
    return "\n".join(lines)


def to_json(
    rows: Sequence[CalibrationRow],
    *,
    embedding: Embedding,
    mechanism: str,
    draws: int,
    target: float,
    recommended: float | None,
) -> str:
    """The calibration and the embedding it ran on, as one JSON document."""
    return json.dumps(
        {
            "embedding": embedding.name,
            "embedding_size": embedding.size,
            "embedding_dim": embedding.dim,
            "embedding_diameter": embedding.diameter(),
            "mechanism": mechanism,
            "draws": draws,
            "target_median_n_w": target,
            "recommended_epsilon": recommended,
            "rows": [r.as_dict() for r in rows],
        },
        ensure_ascii=False,
    )


def parse_floats(text: str) -> list[float]:
    """Positive finite numbers from "a,b,c" (ValueError otherwise)."""
    vals = [float(x) for x in text.split(",") if x.strip()]
    if not vals or not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"expected a comma-separated list of positive numbers, got {text!r}")
    return vals


def mechanism_factory(
    name: str, embedding: Embedding, *, tau: float | None = None, k: int = 20, sigma: float | None = None
) -> Callable[[float], LocalMechanism]:
    """``eps -> mechanism`` for the CLI's ``--mechanism`` names (``lac.client.mechanisms.LOCAL_KINDS``)."""
    return local_kind(name).build(embedding, tau=tau, k=k, sigma=sigma)
