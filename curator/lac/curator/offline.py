"""Offline releases from files (``lac curator release --counts FILE ...``), no server needed.

Input formats
-------------
* Per-user counts: a scipy sparse ``.npz`` written by ``scipy.sparse.save_npz``; rows = users
  (one anonymous report each), columns = vocabulary items, non-negative integer counts.
* Vocabulary: a UTF-8 text file, one n-gram per line, line i naming column i (``--vocab``;
  default: the counts path with ``.npz`` replaced by ``.vocab.txt``). The vocabulary must be
  public (fixed before seeing the private data).
* Public counts (``--public``): either a text file of ``item<TAB>count`` lines (blank lines and
  lines starting with ``#`` ignored) or an ``NgramVocabulary`` ``.npz`` (``NgramVocabulary.save``;
  its items and alpha). Either way it is aligned to the vocabulary by item text: vocabulary items
  absent from the public file get count 0, public items outside the vocabulary are ignored.

Output
------
The released distribution is written atomically to ``--out`` (default: next to the counts,
``<counts stem>.<mechanism>.release.npz``) with arrays ``log_probs`` (float64, one per column),
``items`` (the vocabulary, UTF-8 joined by newlines, as uint8) and ``record`` (the JSON release
record, UTF-8 as uint8). ``release_offline`` returns the same record as a dict.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lac.common.files import atomic_file
from lac.curator.baselines import k_anonymity, laplace_dp, laplace_public_dp
from lac.curator.bayesian import LOG_THETA_GRID, BayesianParams, bayesian_dp
from lac.curator.endtoend import EndToEndParams, end_to_end_dp
from lac.curator.ngrams import NgramVocabulary

__all__ = ["MECHANISMS", "run_mechanism", "load_counts", "load_vocab", "load_public", "default_vocab_path", "default_out_path",
           "release_offline"]

MECHANISMS = ("bayesian", "endtoend", "laplace", "laplace-public", "kanon")


def default_vocab_path(counts: str | os.PathLike) -> Path:
    p = Path(counts)
    return p.with_name((p.name[:-4] if p.name.endswith(".npz") else p.name) + ".vocab.txt")


def default_out_path(counts: str | os.PathLike, mechanism: str) -> Path:
    p = Path(counts)
    stem = p.name[:-4] if p.name.endswith(".npz") else p.name
    return p.with_name(f"{stem}.{mechanism}.release.npz")


def load_counts(path: str | os.PathLike) -> sp.csr_matrix:
    U = sp.load_npz(os.fspath(path)).tocsr()
    if U.data.dtype.kind not in "iuf":
        raise ValueError(f"{path}: counts must be numeric")
    return U


def load_vocab(path: str | os.PathLike) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        items = tuple(line.rstrip("\n").rstrip("\r") for line in f)
    if len(set(items)) != len(items):
        raise ValueError(f"{path}: duplicate items in the vocabulary")
    return items


def load_public(path: str | os.PathLike, items: tuple[str, ...]) -> np.ndarray:
    """alpha aligned with ``items`` (see the module docstring for the two accepted formats)."""
    path = os.fspath(path)
    if path.endswith(".npz"):
        v = NgramVocabulary.load(path)
        table = dict(zip(v.items, (float(a) for a in v.alpha)))
    else:
        table = {}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n").rstrip("\r")
                if not line.strip() or line.startswith("#"):
                    continue
                item, sep, count = line.rpartition("\t")
                if not sep:
                    raise ValueError(f"{path}:{lineno}: expected 'item<TAB>count'")
                if item in table:
                    raise ValueError(f"{path}:{lineno}: duplicate item {item!r}")
                value = float(count)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{path}:{lineno}: count must be finite and >= 0")
                table[item] = value
    return np.array([table.get(it, 0.0) for it in items], dtype=np.float64)


def _atomic_savez(path: Path, **arrays) -> None:
    with atomic_file(path) as f:
        np.savez_compressed(f, **arrays)


def _summary(v: np.ndarray) -> dict:
    v = np.asarray(v, dtype=np.float64)
    return {"min": float(v.min()), "max": float(v.max()), "mean": float(v.mean())}


def _finite_or_none(x):
    return None if x is None or not math.isfinite(x) else float(x)


def run_mechanism(
    U: sp.csr_matrix,
    alpha: np.ndarray,
    mechanism: str,
    epsilon: float,
    delta: float,
    *,
    S: float | None = None,
    C: int | None = None,
    rho: float | None = None,
    sensitivity: str = "bruteforce",
    calibration: str = "auto",
    W: int | None = None,
    n_max: int | None = None,
    K: int = 50,
    public_sensitivity: str = "sound",
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One mechanism on per-user counts U: (released log-probabilities, pre-noise mean, record).

    The log-probabilities of every mechanism are rounded to multiples of ``LOG_THETA_GRID``
    (BayesianDP also snaps h before the softmax): a floating-point mitigation, not a proof.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    defaults = BayesianParams(epsilon=1.0, delta=0.5)
    S = defaults.S if not S else S
    C = defaults.C if not C else C
    rho = defaults.rho if not rho else rho

    rec: dict = {"mechanism": mechanism, "gamma": None, "sigma": None, "calibration": None, "laplace_scale": None}
    if mechanism == "bayesian":
        p = BayesianParams(epsilon=epsilon, delta=delta, S=S, C=C, rho=rho, sensitivity=sensitivity,
                           calibration=calibration, W=W, n_max=n_max)
        r = bayesian_dp(U, alpha, p, rng=rng)
        log_probs, mean = r.log_theta, r.mean
        rec.update(params=dict(S=p.S, C=p.C, rho=p.rho, W=W, n_max=n_max), sensitivity_method=r.sensitivity_method,
                   gamma=r.gamma, sigma=r.sigma, calibration=r.calibration, epsilon=p.epsilon, delta=p.delta,
                   n_users=r.n_users, vocab_size=r.vocab_size, data_dependent=r.data_dependent,
                   statement=r.statement)
    elif mechanism == "endtoend":
        p = EndToEndParams(epsilon=epsilon, delta=delta, C=C, sensitivity=sensitivity, calibration=calibration,
                           W=W, n_max=n_max)
        e = end_to_end_dp(U, alpha, p, rng=rng)
        r = e.release
        log_probs, mean = r.log_theta, r.mean
        rec.update(params=dict(S=e.S, C=C, rho=e.rho, W=W, n_max=n_max, S_grid=list(p.S_grid),
                               rho_grid=list(p.rho_grid), epsilon_select=e.epsilon_select,
                               epsilon_release=e.epsilon_release, n_validation=e.n_validation,
                               n_train=e.n_train, delta_q=e.delta_q),
                   sensitivity_method=r.sensitivity_method, gamma=r.gamma, sigma=r.sigma,
                   calibration=r.calibration, laplace_scale=e.laplace_scale, epsilon=e.epsilon, delta=e.delta,
                   n_users=int(U.shape[0]), vocab_size=r.vocab_size, data_dependent=e.data_dependent,
                   statement=e.statement)
    else:
        if mechanism in ("laplace", "laplace-public") and W is None:
            raise ValueError(f"mechanism {mechanism!r} needs the public per-user item cap W (--W)")
        if mechanism == "laplace":
            b = laplace_dp(U, W=W, C=C, epsilon=epsilon, rng=rng)
        elif mechanism == "laplace-public":
            b = laplace_public_dp(U, alpha, W=W, C=C, epsilon=epsilon, sensitivity=public_sensitivity, rng=rng)
        else:
            b = k_anonymity(U, K=K, C=C)
        with np.errstate(divide="ignore"):
            log_probs = np.log(b.probs)
        mean = b.mean
        rec.update(params=b.params, sensitivity_method=b.sensitivity_method, laplace_scale=b.scale or None,
                   epsilon=_finite_or_none(b.epsilon), delta=b.delta, n_users=b.n_users, vocab_size=b.vocab_size,
                   data_dependent=b.data_dependent, differentially_private=b.differentially_private,
                   statement=b.statement)
    rec.setdefault("differentially_private", True)
    log_probs = np.asarray(log_probs, dtype=np.float64)
    finite = np.isfinite(log_probs)
    log_probs = np.where(finite, np.rint(np.where(finite, log_probs, 0.0) / LOG_THETA_GRID) * LOG_THETA_GRID,
                         log_probs)
    return log_probs, mean, rec


def release_offline(
    counts: str | os.PathLike,
    public: str | os.PathLike,
    mechanism: str,
    epsilon: float,
    delta: float,
    *,
    vocab: str | os.PathLike | None = None,
    S: float | None = None,
    C: int | None = None,
    rho: float | None = None,
    sensitivity: str = "bruteforce",
    calibration: str = "auto",
    W: int | None = None,
    n_max: int | None = None,
    K: int = 50,
    public_sensitivity: str = "sound",
    out: str | os.PathLike | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """Run one mechanism on the files and write the release; returns the release record."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    U = load_counts(counts)
    items = load_vocab(vocab if vocab is not None else default_vocab_path(counts))
    if len(items) != U.shape[1]:
        raise ValueError(f"the vocabulary has {len(items)} items but the counts have {U.shape[1]} columns")
    alpha = load_public(public, items)
    log_probs, mean, rec = run_mechanism(U, alpha, mechanism, epsilon, delta, S=S, C=C, rho=rho,
                                         sensitivity=sensitivity, calibration=calibration, W=W, n_max=n_max, K=K,
                                         public_sensitivity=public_sensitivity, rng=rng)
    rec["mean_summary"] = _summary(mean)
    out_path = Path(out) if out is not None else default_out_path(counts, mechanism)
    rec["out"] = str(out_path)
    blob = np.frombuffer("\n".join(items).encode("utf-8"), dtype=np.uint8)
    _atomic_savez(out_path, log_probs=np.asarray(log_probs, dtype=np.float64), items=blob,
                  record=np.frombuffer(json.dumps(rec).encode("utf-8"), dtype=np.uint8))
    return rec
