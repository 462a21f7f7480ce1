"""k-anonymity (``lac.curator.release.baselines``): NOT differentially private, offline only."""

from __future__ import annotations

from dataclasses import dataclass

from lac.curator.mechanisms import Defaults, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.baselines import k_anonymity

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

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> None:
        return None

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        vocab, caps = inputs.vocab, inputs.caps
        items = tuple(vocab.items)
        U = inputs.reports.vocab_counts(caps.C, caps.W)
        b = k_anonymity(U, K=spec.K, C=caps.C)
        common = dict(vocab_size=len(items), n_reports=int(U.shape[0]))
        return building.baseline_release(spec.mechanism, items, b, common, vocab.orders, inputs.errors)


MECHANISM = KAnonymity()
