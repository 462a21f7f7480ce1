"""Thin adapters from the evaluation's rows to the curator's releases (``lac.curator.runner.run.run``
over the registered mechanisms, ``lac.curator.mechanisms``) and their probability vectors.

Every call is one real release made by the server's path; ``rng`` is a seeded evaluation generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from lac.common.rng import RandomSource
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import MatrixReports, PublicCaps, Release
from lac.curator.runner.run import run

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


# eval row -> the curator's release request (``lac.curator.mechanisms.ReleaseSpec`` keywords besides ε):
# every row but "public" is one release of a registered mechanism (``lac.curator.mechanisms``).
SPECS: dict[str, dict[str, Any]] = {
    "posterior": dict(mechanism="posterior", discovery=False),  # U holds no n-gram to discover
    "bayes": dict(mechanism="bayesian", sensitivity="bruteforce"),
    "bayes-sound": dict(mechanism="bayesian"),
    "endtoend": dict(mechanism="endtoend", sensitivity="bruteforce"),
    "laplace": dict(mechanism="laplace"),
    "laplace-public": dict(mechanism="laplace-public"),
    "laplace-public-obs": dict(mechanism="laplace-public", public_sensitivity="observed"),
    "kanon": dict(mechanism="kanon"),
}


def spec(name: str, eps: float, cfg: EvalConfig, K: int | None = None) -> ReleaseSpec:
    """The release request of eval row ``name`` at ε (the evaluation's δ, S and ρ)."""
    if name not in SPECS:
        raise ValueError(f"unknown mechanism {name!r}")
    kw = dict(SPECS[name])
    m = mechanisms.get(kw["mechanism"])
    if not m.takes_epsilon:
        eps = 1.0  # ignored (k-anonymity)
    knobs = {"S": cfg.S, "rho": cfg.rho, "K": int(K or cfg.table_k)}
    kw.update({k: v for k, v in knobs.items() if k in m.knobs})  # the others would be refused
    return ReleaseSpec(epsilon=eps, delta=cfg.delta, **kw)


def caps(cfg: EvalConfig) -> PublicCaps:
    return PublicCaps(W=cfg.W, C=cfg.C, count_clip=cfg.count_clip)


def release_of(
    name: str, U, vocab: NgramVocabulary, eps: float, cfg: EvalConfig, rng: RandomSource, K: int | None = None
) -> Release:
    """The release of row ``name`` over the vocabulary's columns of U, through the curator's release path."""
    return run(MatrixReports(sp.csr_matrix(U), vocab), vocab, spec(name, eps, cfg, K), caps(cfg), rng=rng)


def posterior(U, vocab: NgramVocabulary, eps: float, cfg: EvalConfig, rng: RandomSource) -> Release:
    """The LAC default over the vocabulary's columns of U (no discovery: U holds no other n-gram)."""
    return release_of("posterior", U, vocab, eps, cfg, rng)


def _stand_in(alpha: np.ndarray) -> NgramVocabulary:
    """A vocabulary over U's columns when the caller has none (the mechanisms read only its α)."""
    a = np.asarray(alpha, dtype=np.float64)
    return NgramVocabulary(tuple(f"c{j}" for j in range(a.size)), a, 1)


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
    """Probability vector released by row ``name`` (see ``LABELS``; "posterior" needs ``vocab``):
    one release of the curator's path (``lac.curator.runner.run.run``), as the server makes it."""
    if name == "public":  # not a mechanism: the public counts alone
        a = np.asarray(alpha, dtype=np.float64)
        return a / a.sum()
    if "discovery" in mechanisms.get(spec(name, eps, cfg, K).mechanism).knobs and vocab is None:
        raise ValueError(f"the {name} release needs the vocabulary")
    if vocab is None:
        vocab = _stand_in(alpha)
    elif alpha is not vocab.alpha:  # e.g. a noisy public prior (figure 4)
        vocab = NgramVocabulary(vocab.items, np.asarray(alpha, dtype=np.float64), vocab.max_n)
    return probabilities(release_of(name, U, vocab, eps, cfg, rng, K))


def probabilities(r: Release) -> np.ndarray:
    """The probability vector a release publishes: its pseudo-counts normalised (uniform when they sum to 0),
    or its probabilities (a release that is a distribution only)."""
    if r.pseudo_counts is not None:
        c = np.asarray(r.pseudo_counts, dtype=np.float64)
        return c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)
    return np.exp(r.log_probs)
