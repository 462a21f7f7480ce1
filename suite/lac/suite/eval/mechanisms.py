"""Thin adapters from the library's mechanisms (lac.curator) to released probability vectors.

Every call is one real release of the library; ``rng`` is a seeded evaluation generator.
"""

from __future__ import annotations

import numpy as np

from lac.common.rng import RandomSource
from lac.curator.baselines import k_anonymity, laplace_dp, laplace_public_dp
from lac.curator.bayesian import BayesianParams, bayesian_dp
from lac.curator.endtoend import EndToEndParams, end_to_end_dp
from lac.curator.ngrams import NgramVocabulary
from lac.curator.posterior import PosteriorParams, PosteriorRelease, posterior_release, weighted_totals
from lac.curator.release import MatrixReports

from .config import EvalConfig

# name -> (label, privacy note)
LABELS = {
    "posterior": ("Gaussian posterior (LAC default)", "sound: data-independent worst case"),
    "bayes": ("BayesianDP (brute-force γ, paper)", "DP claim uses data-dependent sensitivity"),
    "bayes-sound": ("BayesianDP (sound γ)", "sound: data-independent worst case"),
    "endtoend": ("EndToEndDP (private S,ρ tuning, brute-force)", "data-dependent, as the paper"),
    "laplace": ("Laplace", "sound (ℓ1 = W·C)"),
    "laplace-public": ("Laplace + public", "sound (ℓ1 = 2)"),
    "laplace-public-obs": ("Laplace + public (observed ℓ1)", "data-dependent ℓ1 = 2WC/‖c‖₁"),
    "kanon": ("k-anonymity", "NOT differentially private"),
    "public": ("public baseline", "no private data"),
    "private": ("private baseline", "NOT private (exact counts)"),
}


def bayes_params(cfg: EvalConfig, eps: float, sound: bool) -> BayesianParams:
    """BayesianDP parameters at ε: the sound sensitivity (public caps) or the paper's brute force."""
    if sound:
        return BayesianParams(
            epsilon=eps,
            delta=cfg.delta,
            S=cfg.S,
            C=cfg.C,
            rho=cfg.rho,
            sensitivity="sound",
            W=cfg.W,
            count_clip=cfg.count_clip,
        )
    return BayesianParams(epsilon=eps, delta=cfg.delta, S=cfg.S, C=cfg.C, rho=cfg.rho, sensitivity="bruteforce")


def posterior(U, vocab: NgramVocabulary, eps: float, cfg: EvalConfig, rng: RandomSource) -> PosteriorRelease:
    """The LAC default over the vocabulary's columns of U (no discovery: U holds no other n-gram)."""
    p = PosteriorParams(epsilon=eps, delta=cfg.delta, W=cfg.W, C=cfg.C, discovery=False)
    totals = weighted_totals(MatrixReports(U, vocab).blocks(), vocab, p.W, p.C, p.tau, candidates=False)
    return posterior_release(totals, vocab, p, rng)


def release(
    name: str,
    U,
    alpha: np.ndarray,
    eps: float,
    cfg: EvalConfig,
    rng: RandomSource,
    K: int | None = None,
    vocab: NgramVocabulary | None = None,
) -> np.ndarray:
    """Probability vector released by mechanism ``name`` (see ``LABELS``; "posterior" needs ``vocab``)."""
    if name == "posterior":
        if vocab is None:
            raise ValueError("the posterior release needs the vocabulary")
        if alpha is not vocab.alpha:  # e.g. a noisy public prior (figure 4)
            vocab = NgramVocabulary(vocab.items, np.asarray(alpha, dtype=np.float64), vocab.max_n)
        c = posterior(U, vocab, eps, cfg, rng).pseudo_counts
        return c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)
    if name in ("bayes", "bayes-sound"):
        r = bayesian_dp(U, alpha, bayes_params(cfg, eps, name == "bayes-sound"), rng=rng)
        return np.exp(r.log_theta)
    if name == "endtoend":
        p = EndToEndParams(epsilon=eps, delta=cfg.delta, C=cfg.C, sensitivity="bruteforce")
        return np.exp(end_to_end_dp(U, alpha, p, rng=rng).release.log_theta)
    if name == "laplace":
        return np.asarray(laplace_dp(U, W=cfg.W, C=cfg.C, epsilon=eps, rng=rng).probs)
    if name == "laplace-public":
        return np.asarray(laplace_public_dp(U, alpha, W=cfg.W, C=cfg.C, epsilon=eps, rng=rng).probs)
    if name == "laplace-public-obs":
        return np.asarray(
            laplace_public_dp(U, alpha, W=cfg.W, C=cfg.C, epsilon=eps, sensitivity="observed", rng=rng).probs
        )
    if name == "kanon":
        return np.asarray(k_anonymity(U, K=int(K or cfg.table_k), C=cfg.C).probs)
    if name == "public":
        a = np.asarray(alpha, dtype=np.float64)
        return a / a.sum()
    raise ValueError(f"unknown mechanism {name!r}")
