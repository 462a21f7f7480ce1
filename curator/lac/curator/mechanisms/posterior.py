"""The default mechanism: Gaussian noise on normalised report weights, the public prior's
posterior, DP discovery of n-grams outside the public vocabulary (``lac.curator.release.posterior``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from lac.curator.mechanisms import Defaults, ItemNoise, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.errorbars import posterior_errors
from lac.curator.release.posterior import PosteriorParams, WeightedTotals, posterior_release

__all__ = ["MECHANISM", "Posterior"]


@dataclass(frozen=True)
class Posterior(Defaults):
    name: str = "posterior"
    rank: int = 10
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = True
    knobs: frozenset[str] = frozenset({"discovery", "channel"})

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return False

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> ItemNoise:
        W, C, delta = ctx.caps.W, ctx.caps.C, spec.delta

        def noise_at(e: float) -> float:
            return PosteriorParams(e, delta, W=W, C=C, discovery=spec.discovery and e > 2 * delta, unit=ctx.unit).sigma

        m = ctx.unit.max_reports
        remedies = (
            (
                f"covering fewer accounting windows (one user may send {m} reports over these, and σ grows "
                f"with that number)",
            )
            if m > 1
            else ()
        )
        # expected weight of an item with π_j = 1, per report
        per_report = math.sqrt(ctx.words_per_report / ctx.vocab.max_n)
        return ItemNoise(noise_at, "normalised report weights", per_report, False, remedies)

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        vocab, W, C, channel, errors = inputs.vocab, inputs.caps.W, inputs.caps.C, inputs.channel, inputs.errors
        pp = PosteriorParams(
            epsilon=spec.epsilon, delta=spec.delta, W=W, C=C, discovery=spec.discovery, unit=inputs.unit
        )
        totals = inputs.engine.fold(
            inputs.reports,
            partial(building.block_totals, vocab=vocab, W=W, C=C, tau=pp.tau, candidates=spec.discovery),
            building.add_totals,
            WeightedTotals(np.zeros(len(vocab))),
        )
        pr = posterior_release(totals, vocab, pp, rng=inputs.rng, channel=channel)
        errs = None
        if errors is not None:  # the Gaussian mechanism's outputs, the post-processing's fits and public data
            errs = posterior_errors(
                pr.noisy_public,
                pr.items[len(vocab) :],
                pr.found_noisy,
                pr.pseudo_counts,
                pr.fits,
                vocab,
                pr.sigma,
                pr.threshold,
                channel,
                errors,
            )
        return building.Release(
            mechanism=self.name,
            items=pr.items,
            log_probs=building.rounded(pr.log_probs),
            pseudo_counts=pr.pseudo_counts,
            guarantee=pr.guarantee,
            sigma=pr.sigma,
            calibration="analytic",
            n_reports=pr.n_reports,
            vocab_size=len(pr.items),
            params=dict(C=C, W=W, tau=pp.tau, discovery=float(pp.discovery), channel=float(bool(pr.channel))),
            threshold=pr.threshold,
            discovered=pr.discovered,
            channel=pr.channel,
            errors=errs,
        )


MECHANISM = Posterior()
