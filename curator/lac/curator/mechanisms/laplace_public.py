"""Laplace noise on the normalised counts blended with the public prior, ℓ1 sensitivity 2 (sound)
or the data-dependent observed one (``lac.curator.release.baselines``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lac.common.privacy import Budget, PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator.mechanisms import ItemNoise, NoiseQuery
from lac.curator.release import core as release
from lac.curator.release.baselines import laplace_public_dp, laplace_public_from_stats
from lac.curator.release.channel import NgramChannel
from lac.curator.release.engine import Engine
from lac.curator.release.ngrams import NgramVocabulary

__all__ = ["MECHANISM", "LaplacePublic"]


@dataclass(frozen=True)
class LaplacePublic:
    name: str = "laplace-public"
    rank: int = 50
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = False  # pure ε-DP
    knobs: frozenset[str] = frozenset({"public_sensitivity"})

    def validate(self, spec: release.ReleaseSpec) -> None:
        pass

    def data_dependent(self, spec: release.ReleaseSpec) -> bool:
        return spec.public_sensitivity != "sound"

    def charge(self, spec: release.ReleaseSpec) -> Budget:
        return Budget(spec.epsilon, 0.0)

    def noise(self, q: NoiseQuery) -> ItemNoise:
        def noise_at(e: float) -> float:  # the Laplace scale 2/ε on a probability vector, as a standard deviation
            return math.sqrt(2.0) * 2.0 / e

        return ItemNoise(noise_at, "probabilities", 1.0, True, ("the default mechanism (posterior)",))

    def run(
        self,
        reports: release.Reports,
        vocab: NgramVocabulary,
        spec: release.ReleaseSpec,
        caps: release.PublicCaps,
        unit: PrivacyUnit,
        rng: RandomSource | None,
        engine: Engine,
        channel: NgramChannel | None,
    ) -> release.Release:
        W, C = caps.W, caps.C
        items = tuple(vocab.items)
        eps, sens = spec.epsilon, spec.public_sensitivity
        if not isinstance(reports, release.MatrixReports):  # streamed, block by block
            stats = release.stream_stats(reports, vocab, C, W, engine)
            b = laplace_public_from_stats(
                stats, vocab.alpha, W=W, C=C, epsilon=eps, sensitivity=sens, rng=rng, unit=unit
            )
            return release.baseline_release(spec, items, b, dict(vocab_size=len(items), n_reports=stats.n_users))
        U = reports.vocab_counts(C, W)
        b = laplace_public_dp(U, vocab.alpha, W=W, C=C, epsilon=eps, sensitivity=sens, rng=rng, unit=unit)
        return release.baseline_release(spec, items, b, dict(vocab_size=len(items), n_reports=int(U.shape[0])))


MECHANISM = LaplacePublic()
