"""EndToEndDP (``lac.curator.release.endtoend``): BayesianDP with S and ρ tuned privately on a validation
split, ε split between the selection (``SELECTION_SHARE``) and the release."""

from __future__ import annotations

from dataclasses import dataclass

from lac.curator.mechanisms import LogitNoise, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.mechanisms.bayesian import BayesianDP, logit_fields, logit_noise, logit_release_errors
from lac.curator.release import building
from lac.curator.release.endtoend import SELECTION_SHARE, EndToEndParams, end_to_end_dp

__all__ = ["MECHANISM", "EndToEndDP"]


@dataclass(frozen=True)
class EndToEndDP(BayesianDP):
    """BayesianDP's knobs, flags and data dependence; its own noise (ε split) and run."""

    name: str = "endtoend"
    rank: int = 30

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> LogitNoise:
        return logit_noise(spec, ctx, SELECTION_SHARE)  # the release step keeps what the selection does not spend

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        vocab, caps = inputs.vocab, inputs.caps
        W, C = caps.W, caps.C
        items = tuple(vocab.items)
        U = inputs.reports.vocab_counts(C, W)
        ep = EndToEndParams(
            epsilon=spec.epsilon,
            delta=spec.delta,
            C=C,
            sensitivity=spec.sensitivity,
            calibration=spec.calibration,
            W=W,
            count_clip=caps.count_clip,
            validation_cap=caps.validation_cap,
            unit=inputs.unit,
        )
        e = end_to_end_dp(U, vocab.alpha, ep, rng=inputs.rng)
        er = e.release
        return building.Release(
            mechanism=self.name,
            items=items,
            guarantee=e.guarantee,
            laplace_scale=e.laplace_scale,
            **logit_fields(er),
            params=dict(
                S=e.S,
                C=C,
                rho=e.rho,
                W=W,
                count_clip=caps.count_clip,
                epsilon_select=e.epsilon_select,
                epsilon_release=e.epsilon_release,
            ),
            vocab_size=len(items),
            n_reports=int(U.shape[0]),
            errors=logit_release_errors(er.log_theta, er.sigma, e.guarantee.data_dependent, vocab, inputs.errors),
        )


MECHANISM = EndToEndDP()
