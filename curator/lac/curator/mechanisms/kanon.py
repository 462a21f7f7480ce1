"""k-anonymity (``lac.curator.release.baselines``): NOT differentially private, offline only."""

from __future__ import annotations

from dataclasses import dataclass

from lac.common.privacy import PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.engines.local import Engine
from lac.curator.mechanisms import Defaults, NoiseQuery, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.baselines import k_anonymity
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap

__all__ = ["MECHANISM", "KAnonymity"]


@dataclass(frozen=True)
class KAnonymity(Defaults):
    name: str = "kanon"
    rank: int = 90
    over_rpc: bool = False  # NOT differentially private: never over RPC
    takes_epsilon: bool = False
    with_delta: bool = False
    knobs: frozenset[str] = frozenset({"K"})

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return True

    def noise(self, q: NoiseQuery) -> None:
        return None

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
        items = tuple(vocab.items)
        U = reports.vocab_counts(caps.C, caps.W)
        b = k_anonymity(U, K=spec.K, C=caps.C)
        return building.baseline_release(
            spec.mechanism, items, b, dict(vocab_size=len(items), n_reports=int(U.shape[0])), vocab.orders, errors
        )


MECHANISM = KAnonymity()
