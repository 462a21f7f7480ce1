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

Differences from a release by the curator
-----------------------------------------
* No discovery: a counts matrix holds no n-gram outside the vocabulary, so the posterior runs
  without DP discovery and all of δ goes to its Gaussian counts (the statement says so).
* The accuracy check (``lac.curator.runner.preview``) runs as the curator runs it, with the number of
  reports known exactly (the rows of the counts) unless ``ReleaseSpec.expected_reports`` assumes
  one: a release predicted to be swamped by its noise is refused (``ReleaseRefused``, the
  curator's message) unless ``ReleaseSpec.force``.

Output
------
The released distribution is written atomically to ``--out`` (default: next to the counts,
``<counts stem>.<mechanism>.release.npz``) with arrays ``log_probs`` (float64, one per column),
``pseudo_counts`` (float64, the posterior's released counts; only for releases that have them),
``error_center``, ``error_sd``, ``error_order_center``, ``error_order_sd`` (its error bars,
``lac.curator.release.errorbars``; only for DP releases, the record's ``error_bars`` saying what they are),
``items`` (the vocabulary, UTF-8 joined by newlines, as uint8) and ``record`` (the JSON release
record, UTF-8 as uint8). ``release_offline`` returns the same record as a dict.
``lac.curator.lm.model.NgramModel.from_release_file`` builds its language model as the curator does.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from lac.common.files import atomic_file
from lac.common.privacy import PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.release.errorbars import Bootstrap
from lac.curator.runner.preview import MIN_SIGNAL_SHARE, Preview, predict, refusal
from lac.curator.runner.run import run

__all__ = [
    "load_counts",
    "load_vocab",
    "load_public",
    "default_vocab_path",
    "default_out_path",
    "offline_spec",
    "preview_offline",
    "release_offline",
    "ReleaseRefused",
]


class ReleaseRefused(ValueError):
    """The accuracy check predicts that the release's noise would swamp the signal (nothing was spent)."""


def default_vocab_path(counts: str | os.PathLike) -> Path:
    """The vocabulary file next to ``counts``: its ``.npz`` replaced by ``.vocab.txt``."""
    p = Path(counts)
    return p.with_name((p.name[:-4] if p.name.endswith(".npz") else p.name) + ".vocab.txt")


def default_out_path(counts: str | os.PathLike, mechanism: str) -> Path:
    """The output next to ``counts``: ``<stem>.<mechanism>.release.npz``."""
    p = Path(counts)
    stem = p.name[:-4] if p.name.endswith(".npz") else p.name
    return p.with_name(f"{stem}.{mechanism}.release.npz")


def load_counts(path: str | os.PathLike) -> sp.csr_matrix:
    """Per-user counts (CSR, users × items) from a ``scipy.sparse.save_npz`` file; ValueError unless numeric."""
    U = sp.load_npz(os.fspath(path)).tocsr()
    if U.data.dtype.kind not in "iuf":
        raise ValueError(f"{path}: counts must be numeric")
    return U


def load_vocab(path: str | os.PathLike) -> tuple[str, ...]:
    """The vocabulary items, one per line (ValueError on duplicates)."""
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


def offline_spec(spec: ReleaseSpec) -> ReleaseSpec:
    """``spec`` as it runs on a counts matrix: the posterior without discovery (nothing to discover)."""
    return replace(spec, discovery=False) if "discovery" in mechanisms.get(spec.mechanism).knobs else spec


def _inputs(
    counts: str | os.PathLike, public: str | os.PathLike, vocab: str | os.PathLike | None
) -> tuple[sp.csr_matrix, NgramVocabulary]:
    U = load_counts(counts)
    items = load_vocab(vocab if vocab is not None else default_vocab_path(counts))
    if len(items) != U.shape[1]:
        raise ValueError(f"the vocabulary has {len(items)} items but the counts have {U.shape[1]} columns")
    alpha = load_public(public, items)
    return U, NgramVocabulary(items, alpha, max(it.count(" ") + 1 for it in items) if items else 1)


def _predict(
    U: sp.csr_matrix, ngrams: NgramVocabulary, spec: ReleaseSpec, caps: PublicCaps, m: int, target_share: float
) -> Preview | None:
    if spec.data_dependent:  # k-anonymity, data-dependent sensitivities: nothing to predict
        return None
    reports, source = (
        (spec.expected_reports, "assumed by the request")
        if spec.expected_reports is not None
        else (int(U.shape[0]), "the rows of the counts, exact")
    )
    return predict(
        spec, ngrams, caps, PrivacyUnit.user(m), reports=reports, reports_source=source, target_share=target_share
    )


def preview_offline(
    counts: str | os.PathLike,
    public: str | os.PathLike,
    spec: ReleaseSpec,
    caps: PublicCaps,
    *,
    reports_per_user: int = 1,
    vocab: str | os.PathLike | None = None,
    min_signal_share: float = MIN_SIGNAL_SHARE,
) -> Preview | None:
    """The accuracy preview of ``release_offline`` with the same arguments (None: a data-dependent
    release, which cannot be predicted); runs nothing and writes nothing."""
    U, ngrams = _inputs(counts, public, vocab)
    return _predict(U, ngrams, offline_spec(spec), caps, reports_per_user, min_signal_share)


def release_offline(
    counts: str | os.PathLike,
    public: str | os.PathLike,
    spec: ReleaseSpec,
    caps: PublicCaps,
    *,
    reports_per_user: int = 1,
    vocab: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    rng: RandomSource | None = None,
    min_signal_share: float = MIN_SIGNAL_SHARE,
) -> dict:
    """Run ``spec`` on the files and write the release; returns the release record.

    Each row of the counts is one report; one user contributes at most ``reports_per_user``
    rows (the sensitivity covers all of them). The posterior runs without discovery
    (``offline_spec``). ``ReleaseRefused`` if the accuracy check predicts less than
    ``min_signal_share`` of the words standing out of the noise (0: no check), unless ``spec.force``.
    """
    U, ngrams = _inputs(counts, public, vocab)
    spec = offline_spec(spec)
    preview = _predict(U, ngrams, spec, caps, reports_per_user, min_signal_share)
    if preview is not None and preview.swamped and not spec.force and min_signal_share > 0:
        raise ReleaseRefused(refusal(preview, "nothing was spent"))
    r = run(U, ngrams, spec, caps, unit=PrivacyUnit.user(reports_per_user), rng=rng, errors=Bootstrap())
    bars = r.errors.bars if r.errors is not None else None
    rec = {
        "mechanism": r.mechanism,
        "spec": spec.as_dict(),
        "caps": asdict(caps),
        "reports_per_user": reports_per_user,
        "epsilon": r.guarantee.epsilon if r.guarantee else None,
        "delta": r.guarantee.delta if r.guarantee else 0.0,
        "differentially_private": r.differentially_private,
        "data_dependent": r.guarantee is None or r.guarantee.data_dependent,
        "sensitivity_method": r.sensitivity_method,
        "gamma": r.gamma,
        "sigma": r.sigma,
        "calibration": r.calibration,
        "laplace_scale": r.laplace_scale,
        "n_users": r.n_reports,
        "vocab_size": r.vocab_size,
        "params": r.params,
        "statement": r.statement + (" " + bars.statement() if bars is not None else ""),
        "error_bars": bars.to_dict() if bars is not None else {},
        "preview": preview.statement() if preview is not None else None,
    }
    out_path = Path(out) if out is not None else default_out_path(counts, spec.mechanism)
    rec["out"] = str(out_path)
    arrays: dict[str, Any] = {
        "log_probs": np.asarray(r.log_probs, dtype=np.float64),
        "items": np.frombuffer("\n".join(r.items).encode("utf-8"), dtype=np.uint8),
        "record": np.frombuffer(json.dumps(rec).encode("utf-8"), dtype=np.uint8),
    }
    if r.pseudo_counts is not None:
        arrays["pseudo_counts"] = np.asarray(r.pseudo_counts, dtype=np.float64)
    if r.errors is not None:
        arrays |= r.errors.arrays()
    with atomic_file(out_path) as f:
        np.savez_compressed(f, **arrays)
    return rec
