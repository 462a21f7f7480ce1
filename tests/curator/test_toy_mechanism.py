"""Adding a central mechanism and a knob is one module: a toy mechanism defined here, with a knob of its own, is
added by one ``register`` call and runs through the real release handler (``lac.curator.service.handlers.release``)
over a curator's state in a temporary directory, without gRPC.

Checked: the ledger charges exactly the toy's privacy map, its statements are rendered from the typed
``Guarantee`` its run built, and its knob is checked on it and refused on every other mechanism. What a new knob
touches: the mechanism that declares it (``Knob`` in its ``options``); it reaches the mechanism as
``ReleaseSpec.options``. Over RPC it would also need a ``ReleaseRequest`` field and one line of the serde."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from curator_testkit import ingest_batch, on_state

from lac.common.checks import check_int
from lac.common.privacy import Adjacency, Budget, Guarantee, Model, PrivacyUnit
from lac.curator import mechanisms
from lac.curator.mechanisms import Defaults, ItemNoise, Knob, PublicContext, ReleaseInputs, ReleaseSpec
from lac.curator.release import building
from lac.curator.service.handlers import ingest, release, status

SENTENCES = [["the", "dog", "sleeps", "in", "the", "sun"], ["a", "fox", "is", "a", "small", "animal"]] * 5


def _top(value) -> int:
    return check_int(value, "top")  # an integer >= 1


@dataclass(frozen=True)
class TopCounts(Defaults):
    """Laplace noise on the clamped counts of the ``top`` most frequent public n-grams, normalised: pure ε-DP,
    ℓ1 sensitivity m·top·C per user (each report adds at most C to each of the ``top`` items)."""

    name: str = "toy-top"
    rank: int = 70
    over_rpc: bool = True
    takes_epsilon: bool = True
    with_delta: bool = False
    knobs: frozenset[str] = frozenset()
    options: tuple[Knob, ...] = (Knob("top", 3, _top, "how many of the most frequent public n-grams to count"),)
    made: list[Guarantee] = field(default_factory=list)  # the guarantees its runs built (for the test to read)

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        return False

    def scale(self, spec: ReleaseSpec, C: int, unit: PrivacyUnit) -> float:
        return unit.max_reports * spec.options["top"] * C / spec.epsilon

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> ItemNoise:
        top, C, m = spec.options["top"], ctx.caps.C, ctx.unit.max_reports
        return ItemNoise(lambda e: np.sqrt(2.0) * m * top * C / e, "counts", ctx.words_per_report, False)

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> building.Release:
        vocab, C, W = inputs.vocab, inputs.caps.C, inputs.caps.W
        cols = np.argsort(-vocab.alpha, kind="stable")[: spec.options["top"]]  # public: the prior's counts
        U = inputs.reports.vocab_counts(C, W)
        b = self.scale(spec, C, inputs.unit)
        assert inputs.rng is not None
        noisy = np.maximum(np.asarray(U[:, cols].sum(axis=0)).ravel() + inputs.rng.laplace(0.0, b, cols.size), 0.0)
        probs = noisy / noisy.sum() if noisy.sum() > 0 else np.full(cols.size, 1.0 / cols.size)
        g = Guarantee(
            Model.CENTRAL,
            spec.epsilon,
            0.0,
            inputs.unit,
            Adjacency.ADD_REMOVE,
            "toy Laplace on the top public n-grams' counts",
            details=(f"ℓ1 sensitivity m·top·C, Laplace scale b = {b:.6g} per item.",),
        )
        self.made.append(g)
        with np.errstate(divide="ignore"):
            log_probs = np.log(probs)
        return building.Release(
            mechanism=self.name,
            items=tuple(vocab.items[i] for i in cols),
            log_probs=building.rounded(log_probs),
            pseudo_counts=None,
            guarantee=g,
            laplace_scale=b,
            n_reports=int(U.shape[0]),
            vocab_size=int(cols.size),
        )


@pytest.fixture
def toy():
    mechanism = TopCounts()
    mechanisms.register(mechanism)
    try:
        yield mechanism
    finally:
        mechanisms.unregister(mechanism.name)


def test_the_toy_runs_through_the_handler_and_the_ledger_charges_its_privacy_map(tmp_path, public_corpus, toy):
    spec = ReleaseSpec(epsilon=0.7, delta=1e-6, mechanism="toy-top", force=True, options={"top": 4})

    async def run(state):
        batch = ingest_batch(SENTENCES)
        await ingest.ingest(state, batch)
        record = await release.release(state, spec)
        return int(batch.privacy.last_window), record, await status.spent(state)

    window, record, spent = on_state(tmp_path, public_corpus, run)
    assert toy.charge(spec) == Budget(0.7, 0.0)  # pure ε-DP: the δ the request carried is not spent
    assert spent == {window: toy.charge(spec)}
    assert (record.charged_epsilon, record.charged_delta) == (0.7, 0.0)
    assert record.mechanism == "toy-top" and record.vocab_size == 4 and record.differentially_private
    (g,) = toy.made
    assert record.statement.startswith(g.statement()) and record.public_statement.startswith(g.public_statement())
    assert "toy Laplace on the top public n-grams' counts" in record.statement


def test_the_toys_knob_is_checked_on_it_and_refused_on_every_other_mechanism(toy):
    assert ReleaseSpec(epsilon=1.0, mechanism="toy-top").options == {"top": 3}  # its default
    assert mechanisms.with_knob("top") == ("toy-top",)
    with pytest.raises(ValueError, match="top must be an integer >= 1, got 0"):
        ReleaseSpec(epsilon=1.0, mechanism="toy-top", options={"top": 0})
    for other in mechanisms.names():
        if other != "toy-top":
            with pytest.raises(ValueError, match=r"^knob 'top' applies to toy-top only$"):
                ReleaseSpec(epsilon=1.0, mechanism=other, options={"top": 2})
    with pytest.raises(ValueError, match="unknown knob 'nope'"):
        ReleaseSpec(epsilon=1.0, mechanism="toy-top", options={"nope": 1})
    with pytest.raises(ValueError, match="are request fields"):
        mechanisms.register(TopCounts(name="toy-clash", options=(Knob("rho", 0.5, float),)))


def test_the_toy_is_gone_after_its_test():
    assert "toy-top" not in mechanisms.names()
    with pytest.raises(ValueError, match="knob 'top' .*unknown knob|unknown knob 'top'"):
        ReleaseSpec(epsilon=1.0, options={"top": 2})
