"""BayesianDP (``lac.curator.release.bayesian``): Gaussian noise on the logits of a Dirichlet posterior mean,
with the sound sensitivity from the public caps or the papers' data-dependent ones."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from lac.common.privacy import PrivacyUnit
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import Defaults, LogitNoise, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.release.bayesian import BayesianParams, BayesianRelease, bayesian_dp, bayesian_from_stats
from lac.curator.release.errorbars import Bootstrap, ItemErrors, logit_errors, none
from lac.curator.release.gaussian import calibrate
from lac.curator.release.sound import sound_gamma

__all__ = ["MECHANISM", "BayesianDP", "params", "logit_noise", "logit_fields", "logit_release_errors"]


def params(spec: ReleaseSpec, caps: building.PublicCaps, unit: PrivacyUnit) -> BayesianParams:
    """The BayesianDP parameters of ``spec`` under ``caps``."""
    return BayesianParams(
        epsilon=spec.epsilon,
        delta=spec.delta,
        S=spec.S,
        C=caps.C,
        rho=spec.rho,
        sensitivity=spec.sensitivity,
        calibration=spec.calibration,
        W=caps.W,
        count_clip=caps.count_clip,
        unit=unit,
    )


def logit_noise(spec: ReleaseSpec, ctx: PublicContext, selection_share: float = 0.0) -> LogitNoise:
    """The sound σ on the logits of a release that spends ``selection_share`` of ε elsewhere (NaN
    when the sensitivity is data-dependent)."""
    if spec.data_dependent:
        return LogitNoise(float("nan"), lambda e: float("nan"), "")
    caps = ctx.caps
    gamma = sound_gamma(spec.S, caps.C, caps.W, len(ctx.vocab), caps.count_clip, ctx.unit.max_reports)
    eps_rel = spec.epsilon - spec.epsilon * selection_share  # what the release step spends
    sigma = calibrate(spec.rho * gamma, eps_rel, spec.delta, spec.calibration)[0]
    return LogitNoise(
        sigma,
        lambda e: calibrate(spec.rho * gamma, e, spec.delta, spec.calibration)[0],
        "BayesianDP's sound noise does not shrink with more reports; use the default mechanism (posterior)",
    )


def logit_release_errors(
    log_theta, sigma: float, data_dependent: bool, vocab: NgramVocabulary, errors: Bootstrap | None
) -> ItemErrors | None:
    """The error bars of a release of noisy logits (BayesianDP, EndToEndDP): none when its σ is data-derived."""
    if errors is None:
        return None
    if data_dependent:
        return none(building.NOT_DP_NO_ERRORS)
    return logit_errors(log_theta, sigma, vocab.orders, errors)


def logit_fields(r: BayesianRelease) -> dict[str, Any]:
    """The ``Release`` fields of a release of noisy logits (BayesianDP, EndToEndDP's release step)."""
    return dict(
        log_probs=building.rounded(r.log_theta),
        pseudo_counts=None,
        sensitivity_method=r.sensitivity_method,
        gamma=r.gamma,
        sigma=r.sigma,
        calibration=r.calibration,
    )


@dataclass(frozen=True)
class BayesianDP(Defaults):
    name: str = "bayesian"
    rank: int = 20
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = True
    knobs: frozenset[str] = frozenset({"sensitivity", "S", "rho", "calibration"})

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return spec.sensitivity != "sound"

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> LogitNoise:
        return logit_noise(spec, ctx)

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        reports, vocab, caps, engine, rng = inputs.reports, inputs.vocab, inputs.caps, inputs.engine, inputs.rng
        W, C = caps.W, caps.C
        items = tuple(vocab.items)
        p = params(spec, caps, inputs.unit)
        if not isinstance(reports, building.MatrixReports):  # streamed, block by block
            stats = building.stream_stats(reports, vocab, C, W, engine)
            max_sq = None
            if spec.sensitivity == "bruteforce":
                max_sq = engine.fold(
                    reports,
                    partial(building.block_max_sq_dist, vocab=vocab, C=C, W=W, stats=stats, S=p.S),
                    building.max_of,
                    0.0,
                )
            r = bayesian_from_stats(stats, vocab.alpha, p, rng=rng, max_sq_dist=max_sq)
            common: dict[str, Any] = dict(vocab_size=len(items), n_reports=stats.n_users)
        else:
            U = reports.vocab_counts(C, W)
            r = bayesian_dp(U, vocab.alpha, p, rng=rng)
            common = dict(vocab_size=len(items), n_reports=int(U.shape[0]))
        errs = logit_release_errors(r.log_theta, r.sigma, r.data_dependent, vocab, inputs.errors)
        return building.Release(
            mechanism=self.name,
            items=items,
            guarantee=r.guarantee,
            params=dict(S=p.S, C=C, rho=p.rho, W=W, count_clip=caps.count_clip),
            errors=errs,
            **logit_fields(r),
            **common,
        )


MECHANISM = BayesianDP()
