"""Streaming releases (``lac.curator.engines.local``): folds over Parquet segments give releases
bit-identical to the in-memory path, with the same noise."""

from __future__ import annotations

import numpy as np
import pytest
from curator_testkit import random_stored

from lac.common.privacy import PrivacyUnit
from lac.curator.engines.local import LOCAL
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.bayesian import BayesianParams, bayesian_dp
from lac.curator.release.building import PublicCaps, vocab_counts
from lac.curator.release.posterior import weighted_totals
from lac.curator.runner.run import run


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Five segments of random reports (some empty, some longer than W), and a public vocabulary
    that covers part of their n-grams and part of their words."""
    return random_stored(tmp_path_factory.mktemp("segments"), np.random.default_rng(11), 5, lambda k: (0, 80))


CAPS = PublicCaps(W=7, C=2, count_clip=50)


@pytest.mark.parametrize(
    "spec",
    [
        ReleaseSpec(epsilon=1.0, mechanism="bayesian"),
        ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce"),
        ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="claim1"),
        ReleaseSpec(epsilon=1.0, mechanism="laplace"),
        ReleaseSpec(epsilon=1.0, mechanism="laplace-public"),
    ],
    ids=lambda s: f"{s.mechanism}-{s.sensitivity}",
)
def test_streamed_release_is_bit_identical_to_the_in_memory_one(stored, spec):
    unit = PrivacyUnit.client(2, 3, 86400)
    U = stored.vocab_counts(CAPS.C, CAPS.W)  # the whole matrix at once (the former path)
    streamed = run(stored, stored.vocab, spec, CAPS, unit, np.random.default_rng(5), engine=LOCAL)
    in_memory = run(U, stored.vocab, spec, CAPS, unit, np.random.default_rng(5))
    assert streamed.n_reports == U.shape[0] > 0
    np.testing.assert_array_equal(streamed.log_probs, in_memory.log_probs)
    assert (streamed.gamma, streamed.sigma, streamed.laplace_scale) == (
        in_memory.gamma,
        in_memory.sigma,
        in_memory.laplace_scale,
    )
    assert streamed.statement == in_memory.statement
    if spec.sensitivity == "bruteforce":  # and that is the library's own brute force on the same matrix
        p = BayesianParams(epsilon=1.0, delta=spec.delta, S=spec.S, C=CAPS.C, rho=spec.rho, sensitivity="bruteforce")
        assert streamed.gamma == bayesian_dp(U, stored.vocab.alpha, p).gamma > 0


def test_streamed_posterior_equals_one_pass_over_all_blocks(stored):
    whole = weighted_totals(stored.blocks(), stored.vocab, CAPS.W, CAPS.C, 1.0)
    r = run(stored, stored.vocab, ReleaseSpec(epsilon=1.0), CAPS, rng=np.random.default_rng(9))
    again = run(stored, stored.vocab, ReleaseSpec(epsilon=1.0), CAPS, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(r.pseudo_counts, again.pseudo_counts)
    assert r.n_reports == whole.n_reports and len(whole.candidates) > 0  # some n-grams are outside the vocabulary


def test_a_fold_sees_each_segment_once_in_order(stored):
    seen = LOCAL.fold(stored, lambda b: b.n_reports, lambda acc, n: acc + [n], [])
    assert seen == [b.n_reports for b in stored.blocks()] and len(seen) == 5
    assert vocab_counts(stored.blocks(), stored.vocab, CAPS.C, CAPS.W).shape[0] == sum(seen)


def test_worker_processes_give_the_same_release(stored):
    from lac.curator.engines.local import LocalEngine

    two = LocalEngine(workers=2)
    for spec in (ReleaseSpec(epsilon=1.0), ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce")):
        a = run(stored, stored.vocab, spec, CAPS, rng=np.random.default_rng(3), engine=two)
        b = run(stored, stored.vocab, spec, CAPS, rng=np.random.default_rng(3))
        np.testing.assert_array_equal(a.log_probs, b.log_probs)
        assert a.gamma == b.gamma and a.items == b.items
    with pytest.raises(ValueError):
        LocalEngine(workers=0)
