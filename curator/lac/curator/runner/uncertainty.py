"""What a release says about its own noise, per n-gram, from public numbers only (post-processing).

The posterior release adds Gaussian noise of standard deviation σ (in its record, a function of public
configuration) to every n-gram's weighted total, and its pseudo-counts are computed from those noisy totals
(``lac.curator.release.posterior``). Where a pseudo-count is on the same scale as its noisy total, σ is the noise's
standard deviation on the pseudo-count, and σ·p/c (p the released probability, c the pseudo-count) on the
probability. That holds for an order whose pseudo-counts were not scaled up to the public prior's strength
(``posterior.lm_strength``; detected here exactly: their public items then sum to ``LM_PRIOR_SHARE`` of the prior's
mass) and for a release that is not a channel-aware clean estimate (deconvolution amplifies the noise by an amount
the release does not state). Elsewhere the release states no such number, and this module says so with NaN.
"""

from __future__ import annotations

import math

import numpy as np

from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.release.posterior import LM_PRIOR_SHARE
from lac.curator.runner.run import ReleaseRecord

__all__ = ["noise_sd"]


def noise_sd(
    record: ReleaseRecord, items: tuple[str, ...], pseudo: np.ndarray | None, vocab: NgramVocabulary
) -> np.ndarray:
    """Per released item, the standard deviation of the DP noise on its pseudo-count (σ), or NaN where the
    release states none. ``vocab`` is the curator's public vocabulary (the release's public items come first)."""
    out = np.full(len(items), math.nan)
    if (
        pseudo is None
        or record.mechanism != "posterior"
        or record.data_dependent
        or record.channel
        or not record.sigma > 0
        or tuple(items[: len(vocab)]) != vocab.items
    ):
        return out
    pseudo = np.asarray(pseudo, dtype=np.float64)
    orders = np.fromiter((it.count(" ") + 1 for it in items), dtype=np.int64, count=len(items))
    public = np.zeros(len(items), dtype=bool)
    public[: len(vocab)] = True
    for n in np.unique(orders).tolist():
        alpha = float(vocab.alpha[vocab.orders == n].sum())
        mass = float(pseudo[public & (orders == n)].sum())
        if alpha > 0 and math.isclose(mass, LM_PRIOR_SHARE * alpha, rel_tol=1e-9):
            continue  # scaled up by an unstated factor: no statement
        out[orders == n] = record.sigma
    return out
