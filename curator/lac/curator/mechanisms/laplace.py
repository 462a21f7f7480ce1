"""Laplace noise on the clamped counts, ℓ1 sensitivity W·C per report (``lac.curator.release.baselines``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lac.common.privacy import PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.engines.local import Engine
from lac.curator.mechanisms import Defaults, ItemNoise, NoiseQuery, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.baselines import laplace_dp, laplace_from_stats
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap

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

    def noise(self, q: NoiseQuery) -> ItemNoise:
        m = q.unit.max_reports

        def noise_at(e: float) -> float:  # the Laplace scale m·W·C/ε, as a standard deviation
            return math.sqrt(2.0) * m * q.W * q.C / e

        return ItemNoise(
            noise_at,
            "counts",
            q.words_per_report,
            False,
            ("the default mechanism (posterior), whose noise does not grow with W·C",),
        )

    def run(
        self,
        reports: building.Reports,
        vocab: NgramVocabulary,
        spec: ReleaseSpec,
        caps: building.PublicCaps,
        unit: PrivacyUnit,
        rng: RandomSource | None,
        engine: Engine,
        channel: NgramChannel | None,
        errors: Bootstrap | None = None,
    ) -> building.Release:
        W, C, eps = caps.W, caps.C, spec.epsilon
        return building.counted_baseline(
            reports,
            vocab,
            spec.mechanism,
            caps,
            engine,
            lambda stats: laplace_from_stats(stats, W=W, C=C, epsilon=eps, rng=rng, unit=unit),
            lambda U: laplace_dp(U, W=W, C=C, epsilon=eps, rng=rng, unit=unit),
            errors,
        )


MECHANISM = Laplace()
