"""The central mechanisms as one protocol and registry (``lac.curator.mechanisms``).

* Golden releases: every mechanism and its variants run through ``runner.run`` on a fixed small
  dataset with a seeded generator, compared with golden values recorded before the mechanisms moved
  into the registry (``tests/curator/data/mechanism_golden.{npz,json}``). What they pin, machine
  independently: exactly, the released items and their order, the statement, the charge, every
  integer and flag; within a relative ``GOLDEN_RTOL`` (1e-12), every float (log-probabilities,
  pseudo-counts, σ, γ, parameters): numpy's vectorised sums and transcendental functions take
  other paths on other processors (AVX-512 vs AVX2) and differ in the last bits, never by more.
  Regenerate only when a release is meant to change, with
  ``LAC_REGEN_GOLDEN=1 python -m pytest tests/curator/test_mechanism_registry.py``.
* The registry lists exactly the mechanisms; ``over_rpc`` leaves out k-anonymity.
* Privacy maps per mechanism: the charge and the preview's noise, to the digit.
* Adding a mechanism is one module: a toy mechanism registered here is accepted by ``ReleaseSpec``
  and dispatched by ``runner.run``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from lac.common.privacy import Adjacency, Budget, Guarantee, Model, PrivacyUnit
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary, report_items
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release import building
from lac.curator.release.building import ItemReports, MatrixReports, PublicCaps
from lac.curator.release.channel import NgramChannel, WordChannel
from lac.curator.runner import run as runner

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


def _run(case: str, run=runner.run) -> building.Release:
    kw, kind, with_channel = CASES[case]
    vocab = _vocab()
    items = ItemReports([report_items([[s] for s in _sents(_USERS)], vocab.max_n, vocab.words)], vocab)
    reports = items if kind == "items" else MatrixReports(items.vocab_counts(CAPS.C, CAPS.W), vocab)
    rng = np.random.default_rng(sum(map(ord, case)))
    channel = _channel(vocab) if with_channel else None
    return run(reports, vocab, ReleaseSpec(**kw), CAPS, PrivacyUnit.report(), rng=rng, channel=channel)


def _summary(r: building.Release) -> dict:
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


GOLDEN_RTOL = 1e-12  # relative: the last few bits of a float may differ between processors, no more


def _same(got, want, where: str = "") -> None:
    """``got`` equals ``want`` (JSON values): floats within ``GOLDEN_RTOL``, everything else exactly."""
    if isinstance(want, float) and not isinstance(got, bool) and isinstance(got, int | float):
        assert got == pytest.approx(want, rel=GOLDEN_RTOL, abs=0.0, nan_ok=True), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want and type(got) is type(want), where


@pytest.mark.parametrize("case", list(CASES))
def test_release_matches_the_golden_values(case, golden):
    meta, arrays = golden
    r = _run(case)
    _same(json.loads(json.dumps(_summary(r), ensure_ascii=False)), meta[case], case)
    np.testing.assert_allclose(np.asarray(r.log_probs), arrays[f"{case}/log_probs"], rtol=GOLDEN_RTOL, atol=0)
    if f"{case}/pseudo_counts" in arrays:
        assert r.pseudo_counts is not None
        np.testing.assert_allclose(
            np.asarray(r.pseudo_counts), arrays[f"{case}/pseudo_counts"], rtol=GOLDEN_RTOL, atol=0
        )
    else:
        assert r.pseudo_counts is None


def test_the_golden_comparison_can_fail(golden):
    """The tolerance tells a last-bit difference from a real change."""
    meta, _ = golden
    want = meta["posterior"]
    _same({**want, "sigma": want["sigma"] * (1 + 1e-15)}, want)  # a few ulps: the same release
    for changed in (
        {**want, "sigma": want["sigma"] * (1 + 1e-9)},
        {**want, "items": want["items"][::-1]},
        {**want, "n_reports": want["n_reports"] + 1},
        {**want, "statement": want["statement"] + " "},
    ):
        with pytest.raises(AssertionError):
            _same(changed, want)


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


# --- the registry -------------------------------------------------------------------------------


def test_the_registry_lists_exactly_the_mechanisms():
    assert mechanisms.names() == ("posterior", "bayesian", "endtoend", "laplace", "laplace-public", "kanon")
    assert mechanisms.over_rpc() == ("posterior", "bayesian", "endtoend", "laplace", "laplace-public")
    assert mechanisms.offline_only() == ("kanon",)
    assert mechanisms.with_knob("sensitivity") == ("bayesian", "endtoend")
    assert mechanisms.with_knob("public_sensitivity") == ("laplace-public",)
    for name, m in mechanisms.REGISTRY.items():
        assert m.name == name and m.knobs <= mechanisms.KNOBS
    with pytest.raises(ValueError, match="already registered"):
        mechanisms.register(mechanisms.get("laplace"))


def test_the_rpc_translation_reads_the_registry():
    from lac.curator.service import serde

    assert serde.PURE_MECHANISMS == ("laplace", "laplace-public")


# --- privacy maps: exact where IEEE arithmetic makes them so, else to GOLDEN_RTOL --------------

UNIT3 = PrivacyUnit.user(3)


def _noise(name: str, unit: PrivacyUnit = UNIT3, **kw):
    """The preview's noise of ``name`` at ε = 1.5, δ = 1e-6 (spec keywords ``kw``), L = 5 words per report."""
    spec = ReleaseSpec(epsilon=1.5, delta=1e-6, mechanism=name, **kw)
    return mechanisms.get(name).noise(spec, mechanisms.PublicContext(_vocab(), CAPS, unit, words_per_report=5.0))


@pytest.mark.parametrize(
    "name, charge, data_dependent",
    [
        ("posterior", (1.5, 1e-6), False),
        ("bayesian", (1.5, 1e-6), False),
        ("endtoend", (1.5, 1e-6), False),
        ("laplace", (1.5, 0.0), False),  # pure ε-DP: δ = 0 whatever δ the spec carries
        ("laplace-public", (1.5, 0.0), False),
        ("kanon", (1.5, 0.0), True),  # never charged: its release has no guarantee
    ],
)
def test_charge_per_mechanism(name, charge, data_dependent):
    spec = ReleaseSpec(epsilon=1.5, delta=1e-6, mechanism=name)
    assert (spec.budget.epsilon, spec.budget.delta) == charge
    assert mechanisms.get(name).charge(spec) == spec.budget
    assert spec.data_dependent is data_dependent
    assert mechanisms.get(name).with_delta is (charge[1] > 0)


# every mechanism and variant over a grid of ε and δ: (ReleaseSpec keywords, reports kind)
GRID = [
    ({**kw, "epsilon": eps, "delta": delta}, kind)
    for kw, kind, _ in CASES.values()
    for eps in (0.5, 4.0)
    for delta in (1e-7, 1e-5)
]


@pytest.mark.parametrize("kw, kind", GRID)
def test_the_ledger_records_exactly_the_privacy_map(kw, kind):
    """The one charge: what the ledger's record spends is the mechanism's privacy map of the spec (0: not DP)."""
    from lac.curator.runner.run import ReleaseRecord

    spec = ReleaseSpec(**kw)
    vocab = _vocab()
    items = ItemReports([report_items([[s] for s in _sents(_USERS[:40])], vocab.max_n, vocab.words)], vocab)
    reports = items if kind == "items" else MatrixReports(items.vocab_counts(CAPS.C, CAPS.W), vocab)
    r = runner.run(reports, vocab, spec, CAPS, rng=np.random.default_rng(1))
    rec = ReleaseRecord.of(r, "id", "now", vocab.max_n, (0, 0), PrivacyUnit.report())
    m = mechanisms.get(spec.mechanism)
    want = Budget(0.0, 0.0) if m.data_dependent(spec) else m.charge(spec)
    assert (rec.charged_epsilon, rec.charged_delta) == (want.epsilon, want.delta)
    assert r.charge == (None if m.data_dependent(spec) else m.charge(spec))
    assert rec.differentially_private is (r.charge is not None)


def test_a_guarantee_that_disagrees_with_the_privacy_map_is_refused():
    """The check can fail: a mechanism whose map charges a release its guarantee says is not DP."""
    from lac.curator.mechanisms.laplace import Laplace

    class BrokenMap(Laplace):
        def data_dependent(self, spec: ReleaseSpec) -> bool:  # wrong: its Laplace release is DP
            return True

    mechanisms.register(BrokenMap(name="toy-broken-map"))
    try:
        spec = ReleaseSpec(epsilon=1.0, mechanism="toy-broken-map")
        with pytest.raises(RuntimeError, match="toy-broken-map.*release is DP but its privacy map charges None"):
            runner.run(sp.csr_matrix((3, len(_vocab()))), _vocab(), spec, CAPS)
    finally:
        mechanisms.unregister("toy-broken-map")


def test_data_dependent_variants_are_flagged_by_their_mechanism():
    for name in ("bayesian", "endtoend"):
        assert ReleaseSpec(1.0, mechanism=name, sensitivity="bruteforce").data_dependent
        assert ReleaseSpec(1.0, mechanism=name, sensitivity="claim1").data_dependent
    assert ReleaseSpec(1.0, mechanism="laplace-public", public_sensitivity="observed").data_dependent


def test_laplace_noise_is_its_scale_m_w_c_over_epsilon():
    n = _noise("laplace")
    assert isinstance(n, mechanisms.ItemNoise)
    # scale b = m·W·C/ε = 3·20·2/1.5 = 80; standard deviation √2·b
    assert n.noise_at(1.5) == math.sqrt(2.0) * 80.0 == 113.13708498984761
    assert (n.unit, n.per_report, n.fixed) == ("counts", 5.0, False)
    # the release's scale is W·C/ε per report (m = 1): 20·2/1.5
    assert _golden_meta()["laplace"]["laplace_scale"] == 26.666666666666668 == 40 / 1.5


def test_laplace_public_noise_is_two_over_epsilon():
    n = _noise("laplace-public")
    assert isinstance(n, mechanisms.ItemNoise)
    assert n.noise_at(1.5) == math.sqrt(2.0) * 2.0 / 1.5 == 1.885618083164127
    assert (n.unit, n.per_report, n.fixed) == ("probabilities", 1.0, True)
    assert _golden_meta()["laplace-public-sound"]["laplace_scale"] == 1.3333333333333333 == 2 / 1.5


def test_posterior_noise_is_its_params_sigma():
    from lac.curator.release.posterior import PosteriorParams

    n = _noise("posterior")
    assert isinstance(n, mechanisms.ItemNoise)
    assert n.noise_at(1.5) == pytest.approx(8.986970429352231, rel=GOLDEN_RTOL)  # the calibration, recorded
    assert n.noise_at(1.5) == PosteriorParams(1.5, 1e-6, W=CAPS.W, C=CAPS.C, discovery=True, unit=UNIT3).sigma
    assert n.per_report == math.sqrt(5.0 / 2) and n.unit == "normalised report weights"
    assert len(n.remedies) == 1 and "3 reports" in n.remedies[0]
    assert _noise("posterior", unit=PrivacyUnit.report()).remedies == ()


def test_bayesian_and_endtoend_noise_on_the_logits():
    from lac.curator.release.endtoend import SELECTION_SHARE

    b = _noise("bayesian")
    e = _noise("endtoend")
    assert isinstance(b, mechanisms.LogitNoise) and isinstance(e, mechanisms.LogitNoise)
    assert b.sigma == pytest.approx(11.950621164450316, rel=GOLDEN_RTOL)
    assert e.sigma == pytest.approx(17.38516857066525, rel=GOLDEN_RTOL)
    # EndToEndDP's release step spends what its selection (SELECTION_SHARE of ε) leaves
    assert e.sigma == b.sigma_at(1.5 - 1.5 * SELECTION_SHARE)
    assert b.sigma_at(3.0) == e.sigma_at(3.0) == pytest.approx(6.353214457409594, rel=GOLDEN_RTOL)
    assert math.isnan(_noise("bayesian", sensitivity="bruteforce").sigma)


def test_kanon_has_no_noise_and_no_preview():
    from lac.curator.runner.preview import predict

    assert _noise("kanon") is None
    with pytest.raises(ValueError, match="no preview for mechanism 'kanon'"):
        predict(ReleaseSpec(1.0, mechanism="kanon"), _vocab(), CAPS, PrivacyUnit.report(), reports=10)


def _golden_meta() -> dict:
    return json.loads(GOLDEN_JSON.read_text(encoding="utf-8"))


# --- adding a mechanism is one module -----------------------------------------------------------


class _Uniform:
    """A toy mechanism, all in one object: the uniform distribution over the vocabulary (no data read)."""

    name = "toy-uniform"
    rank = 60
    over_rpc = True
    takes_epsilon = True
    with_delta = False
    knobs = frozenset({"public_sensitivity"})
    options = ()

    def validate(self, spec):
        if spec.epsilon > 100:
            raise ValueError("toy-uniform: epsilon must be at most 100")

    def data_dependent(self, spec):
        return False

    def charge(self, spec):
        return Budget(spec.epsilon, 0.0)

    def noise(self, spec, ctx):
        return mechanisms.ItemNoise(lambda e: 1.0 / e, "probabilities", 1.0, True)

    def run(self, spec, inputs):
        n = len(inputs.vocab)
        return building.Release(
            mechanism=self.name,
            items=tuple(inputs.vocab.items),
            log_probs=np.full(n, -math.log(n)),
            pseudo_counts=None,
            guarantee=Guarantee(
                Model.CENTRAL, spec.epsilon, 0.0, inputs.unit, Adjacency.ADD_REMOVE, "uniform (no data read)"
            ),
            sensitivity_method="none",
            n_reports=0,
            vocab_size=n,
        )


@pytest.fixture
def toy():
    mechanisms.register(_Uniform())
    try:
        yield
    finally:
        mechanisms.unregister("toy-uniform")


def test_a_new_mechanism_is_one_registered_object(toy):
    assert mechanisms.names()[-2:] == ("toy-uniform", "kanon")
    assert "toy-uniform" in mechanisms.over_rpc()
    spec = ReleaseSpec(epsilon=2.0, mechanism="toy-uniform", public_sensitivity="observed")
    assert spec.budget == Budget(2.0, 0.0) and not spec.data_dependent
    with pytest.raises(ValueError, match="at most 100"):
        ReleaseSpec(epsilon=200.0, mechanism="toy-uniform")
    with pytest.raises(ValueError, match="applies to bayesian and endtoend only"):
        ReleaseSpec(epsilon=2.0, mechanism="toy-uniform", sensitivity="bruteforce")
    vocab = _vocab()
    r = runner.run(sp.csr_matrix((3, len(vocab))), vocab, spec, CAPS)
    assert r.mechanism == "toy-uniform" and r.items == tuple(vocab.items)
    np.testing.assert_allclose(np.exp(r.log_probs).sum(), 1.0)
    from lac.curator.runner.preview import predict

    p = predict(spec, vocab, CAPS, PrivacyUnit.report(), reports=10)
    assert p.noise == 0.5 and p.noise_unit == "probabilities"


def test_a_knob_set_on_a_mechanism_that_would_ignore_it_is_refused():
    """calibration, S, rho and K away from their defaults name the mechanisms they apply to; at their defaults (what
    a request that does not set them carries) every mechanism takes them."""
    for mechanism, knob, value in (
        ("laplace", "calibration", "classic"),
        ("posterior", "S", 0.5),
        ("laplace-public", "rho", 0.9),
        ("posterior", "K", 3),
    ):
        with pytest.raises(ValueError, match=rf"^{knob} = .* applies to .* only, not '{mechanism}'$"):
            ReleaseSpec(epsilon=1.0, mechanism=mechanism, **{knob: value})
    for mechanism in mechanisms.names():
        ReleaseSpec(epsilon=1.0, mechanism=mechanism, calibration="auto", S=0.01, rho=0.5, K=50)
    assert ReleaseSpec(epsilon=1.0, mechanism="bayesian", calibration="classic", S=0.5).S == 0.5


def test_unknown_mechanism_message_is_unchanged():
    with pytest.raises(
        ValueError,
        match=r"unknown mechanism 'nope'; available: posterior, bayesian, endtoend, laplace, laplace-public$",
    ):
        ReleaseSpec(epsilon=1.0, mechanism="nope")
