"""Thin adapters from the library's mechanisms (lac.curator) to released probability vectors.

Every call is one real release of the library; ``rng`` is a seeded evaluation generator.
"""

from __future__ import annotations

import numpy as np

from lac.curator.baselines import k_anonymity, laplace_dp, laplace_public_dp
from lac.curator.bayesian import BayesianParams, bayesian_dp
from lac.curator.endtoend import EndToEndParams, end_to_end_dp

from .config import EvalConfig

# name -> (label, privacy note)
LABELS = {
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
    if sound:
        return BayesianParams(epsilon=eps, delta=cfg.delta, S=cfg.S, C=cfg.C, rho=cfg.rho, sensitivity="sound",
                              W=cfg.W, count_clip=cfg.count_clip)
    return BayesianParams(epsilon=eps, delta=cfg.delta, S=cfg.S, C=cfg.C, rho=cfg.rho, sensitivity="bruteforce")


def release(name: str, U, alpha: np.ndarray, eps: float, cfg: EvalConfig, rng: np.random.Generator,
            K: int | None = None) -> np.ndarray:
    """Probability vector released by mechanism ``name`` (see ``LABELS``)."""
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
        return np.asarray(laplace_public_dp(U, alpha, W=cfg.W, C=cfg.C, epsilon=eps, sensitivity="observed",
                                            rng=rng).probs)
    if name == "kanon":
        return np.asarray(k_anonymity(U, K=int(K or cfg.table_k), C=cfg.C).probs)
    if name == "public":
        a = np.asarray(alpha, dtype=np.float64)
        return a / a.sum()
    raise ValueError(f"unknown mechanism {name!r}")
