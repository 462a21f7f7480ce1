"""The central mechanisms as one protocol and registry (``lac.curator.mechanisms``).

* Bit-identical releases: every mechanism and its variants run through ``release.run`` on a fixed
  small dataset with a seeded generator, compared with golden values recorded before the
  mechanisms moved into the registry (``tests/curator/data/mechanism_golden.{npz,json}``;
  regenerate with ``LAC_REGEN_GOLDEN=1`` only when a release is meant to change).
* The registry lists exactly the mechanisms; ``over_rpc`` leaves out k-anonymity.
* Privacy maps per mechanism: the charge and the preview's noise, to the digit.
* Adding a mechanism is one module: a toy mechanism registered here is accepted by ``ReleaseSpec``
  and dispatched by ``release.run``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from lac.common.privacy import PrivacyUnit
from lac.curator import release
from lac.curator.channel import NgramChannel, WordChannel
from lac.curator.ngrams import NgramVocabulary, report_items
from lac.curator.release import ItemReports, MatrixReports, PublicCaps, ReleaseSpec

DATA = Path(__file__).parent / "data"
GOLDEN_NPZ = DATA / "mechanism_golden.npz"
GOLDEN_JSON = DATA / "mechanism_golden.json"

_PUBLIC = [
    "the cat sat on the mat",
    "the dog sat on the rug",
    "a cat and a dog ran",
    "the bird sang on the tree",
    "a bird and a cat sat",
    "the mat was on the floor",
    "the dog ran to the tree",
]
_USERS = [
    "the cat sat on the rug",
    "a dog sat on the mat",
    "the bird ran to the tree",
    "the cat and the dog sang",
    "a fish swam in the pond",  # words outside the public vocabulary (discovery)
    "the cat sat on the mat",
    "the dog ran on the floor",
    "a bird sang on the mat",
    "the fish swam to the tree",
    "the cat ran",
] * 30

# name -> (ReleaseSpec keywords, reports kind: "items" streamed / "matrix" offline, with a channel)
CASES: dict[str, tuple[dict, str, bool]] = {
    "posterior": (dict(mechanism="posterior", epsilon=8.0), "items", False),
    "posterior-nodiscovery": (dict(mechanism="posterior", epsilon=8.0, discovery=False), "items", False),
    "posterior-matrix": (dict(mechanism="posterior", epsilon=8.0, discovery=False), "matrix", False),
    "posterior-channel": (dict(mechanism="posterior", epsilon=8.0), "items", True),
    "bayesian-sound": (dict(mechanism="bayesian", epsilon=2.0), "items", False),
    "bayesian-bruteforce": (dict(mechanism="bayesian", epsilon=2.0, sensitivity="bruteforce"), "items", False),
    "bayesian-claim1": (dict(mechanism="bayesian", epsilon=2.0, sensitivity="claim1"), "items", False),
    "bayesian-sound-matrix": (dict(mechanism="bayesian", epsilon=2.0, S=0.02, rho=0.7), "matrix", False),
    "bayesian-bruteforce-matrix": (dict(mechanism="bayesian", epsilon=2.0, sensitivity="bruteforce"), "matrix", False),
    "endtoend": (dict(mechanism="endtoend", epsilon=3.0), "items", False),
    "endtoend-bruteforce": (dict(mechanism="endtoend", epsilon=3.0, sensitivity="bruteforce"), "matrix", False),
    "laplace": (dict(mechanism="laplace", epsilon=1.5), "items", False),
    "laplace-matrix": (dict(mechanism="laplace", epsilon=1.5), "matrix", False),
    "laplace-public-sound": (dict(mechanism="laplace-public", epsilon=1.5), "items", False),
    "laplace-public-observed": (
        dict(mechanism="laplace-public", epsilon=1.5, public_sensitivity="observed"),
        "items",
        False,
    ),
    "laplace-public-observed-matrix": (
        dict(mechanism="laplace-public", epsilon=1.5, public_sensitivity="observed"),
        "matrix",
        False,
    ),
    "kanon": (dict(mechanism="kanon", epsilon=1.0, K=2), "matrix", False),
}

CAPS = PublicCaps(W=20, C=2)


def _sents(texts: list[str]) -> list[list[str]]:
    return [t.split() for t in texts]


def _vocab() -> NgramVocabulary:
    return NgramVocabulary.from_sentences(_sents(_PUBLIC), max_n=2, min_count=1)


def _channel(vocab: NgramVocabulary) -> NgramChannel:
    """A small word channel: each class keeps itself with 0.8 and moves to the next class with 0.2."""
    tokens = {t for it in vocab.items for t in it.split(" ")}
    classes = tuple(sorted(tokens | {"<s>", "</s>", "<unk>"}))
    n = len(classes)
    rows = np.repeat(np.arange(n), 2)
    cols = np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1).reshape(-1)
    vals = np.tile([0.8, 0.2], n)
    word = WordChannel(classes, sp.csr_matrix((vals, (rows, cols)), shape=(n, n)), 10, "test")
    return NgramChannel.build(word, vocab)


def _run(case: str, run=release.run) -> release.Release:
    kw, kind, with_channel = CASES[case]
    vocab = _vocab()
    items = ItemReports([report_items([[s] for s in _sents(_USERS)], vocab.max_n, vocab.words)], vocab)
    reports = items if kind == "items" else MatrixReports(items.vocab_counts(CAPS.C, CAPS.W), vocab)
    rng = np.random.default_rng(sum(map(ord, case)))
    channel = _channel(vocab) if with_channel else None
    return run(reports, vocab, ReleaseSpec(**kw), CAPS, PrivacyUnit.report(), rng=rng, channel=channel)


def _summary(r: release.Release) -> dict:
    return dict(
        mechanism=r.mechanism,
        items=list(r.items),
        statement=r.statement,
        params={k: float(v) for k, v in r.params.items()},
        sensitivity_method=r.sensitivity_method,
        gamma=r.gamma,
        sigma=r.sigma,
        calibration=r.calibration,
        laplace_scale=r.laplace_scale,
        n_reports=r.n_reports,
        vocab_size=r.vocab_size,
        threshold=r.threshold,
        discovered=r.discovered,
        channel=r.channel,
        differentially_private=r.differentially_private,
        charge=None if r.charge is None else [r.charge.epsilon, r.charge.delta],
    )


def regenerate() -> None:
    """Record the golden values from the current code (run once, with LAC_REGEN_GOLDEN=1)."""
    DATA.mkdir(exist_ok=True)
    arrays, meta = {}, {}
    for case in CASES:
        r = _run(case)
        arrays[f"{case}/log_probs"] = np.asarray(r.log_probs)
        if r.pseudo_counts is not None:
            arrays[f"{case}/pseudo_counts"] = np.asarray(r.pseudo_counts)
        meta[case] = _summary(r)
    np.savez_compressed(GOLDEN_NPZ, **arrays)
    GOLDEN_JSON.write_text(json.dumps(meta, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


if os.environ.get("LAC_REGEN_GOLDEN") == "1":  # pragma: no cover - a maintainer's step
    regenerate()


@pytest.fixture(scope="module")
def golden():
    meta = json.loads(GOLDEN_JSON.read_text(encoding="utf-8"))
    with np.load(GOLDEN_NPZ) as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


@pytest.mark.parametrize("case", list(CASES))
def test_release_is_bit_identical_to_the_golden_values(case, golden):
    meta, arrays = golden
    r = _run(case)
    assert json.loads(json.dumps(_summary(r), ensure_ascii=False)) == meta[case]
    np.testing.assert_array_equal(np.asarray(r.log_probs), arrays[f"{case}/log_probs"])
    if f"{case}/pseudo_counts" in arrays:
        assert r.pseudo_counts is not None
        np.testing.assert_array_equal(np.asarray(r.pseudo_counts), arrays[f"{case}/pseudo_counts"])
    else:
        assert r.pseudo_counts is None


def test_every_variant_ran_as_asked(golden):
    meta, _ = golden
    assert meta["posterior"]["discovered"] > 0 and meta["posterior-nodiscovery"]["discovered"] == 0
    assert meta["posterior-channel"]["channel"] == "test"
    assert {meta[c]["sensitivity_method"] for c in ("bayesian-sound", "bayesian-bruteforce", "bayesian-claim1")} == {
        "sound",
        "bruteforce",
        "claim1",
    }
    assert meta["kanon"]["charge"] is None and not meta["kanon"]["differentially_private"]
    assert meta["laplace-public-observed"]["charge"] is None
    assert meta["laplace"]["charge"] == [1.5, 0.0]
