"""Laplace noise on the normalised counts blended with the public prior, ℓ1 sensitivity 2 (sound)
or the data-dependent observed one (``lac.curator.release.baselines``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lac.curator.mechanisms import Defaults, ItemNoise, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.baselines import laplace_public_dp, laplace_public_from_stats

__all__ = ["MECHANISM", "LaplacePublic"]


@dataclass(frozen=True)
class LaplacePublic(Defaults):
    name: str = "laplace-public"
    rank: int = 50
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = False  # pure ε-DP
    knobs: frozenset[str] = frozenset({"public_sensitivity"})

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return spec.public_sensitivity != "sound"

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> ItemNoise:
        def noise_at(e: float) -> float:  # the Laplace scale 2/ε on a probability vector, as a standard deviation
            return math.sqrt(2.0) * 2.0 / e

        return ItemNoise(noise_at, "probabilities", 1.0, True, ("the default mechanism (posterior)",))

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        W, C, eps, sens, alpha = inputs.caps.W, inputs.caps.C, spec.epsilon, spec.public_sensitivity, inputs.vocab.alpha
        rng, unit = inputs.rng, inputs.unit
        return building.counted_baseline(
            spec.mechanism,
            inputs,
            lambda stats: laplace_public_from_stats(
                stats, alpha, W=W, C=C, epsilon=eps, sensitivity=sens, rng=rng, unit=unit
            ),
            lambda U: laplace_public_dp(U, alpha, W=W, C=C, epsilon=eps, sensitivity=sens, rng=rng, unit=unit),
        )


MECHANISM = LaplacePublic()
