"""Laplace noise on the clamped counts, ℓ1 sensitivity W·C per report (``lac.curator.release.baselines``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lac.curator.mechanisms import Defaults, ItemNoise, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.baselines import laplace_dp, laplace_from_stats

__all__ = ["MECHANISM", "Laplace"]


@dataclass(frozen=True)
class Laplace(Defaults):
    name: str = "laplace"
    rank: int = 40
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = False  # pure ε-DP
    knobs: frozenset[str] = frozenset()

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return False

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> ItemNoise:
        m, W, C = ctx.unit.max_reports, ctx.caps.W, ctx.caps.C

        def noise_at(e: float) -> float:  # the Laplace scale m·W·C/ε, as a standard deviation
            return math.sqrt(2.0) * m * W * C / e

        return ItemNoise(
            noise_at,
            "counts",
            ctx.words_per_report,
            False,
            ("the default mechanism (posterior), whose noise does not grow with W·C",),
        )

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        W, C, eps, rng, unit = inputs.caps.W, inputs.caps.C, spec.epsilon, inputs.rng, inputs.unit
        return building.counted_baseline(
            spec.mechanism,
            inputs,
            lambda stats: laplace_from_stats(stats, W=W, C=C, epsilon=eps, rng=rng, unit=unit),
            lambda U: laplace_dp(U, W=W, C=C, epsilon=eps, rng=rng, unit=unit),
        )


MECHANISM = Laplace()
