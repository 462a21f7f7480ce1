"""The random source and the local mechanisms satisfy the protocols the Localizer and the releases take."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lac.client.localizer import Localizer
from lac.client.mechanisms import LocalMechanism, MultivariateLaplace
from lac.client.modulated import DensityModulated
from lac.client.truncated import DistanceTruncated, KNNTruncated
from lac.common.rng import CsprngGenerator, RandomSource, generator, secure_generator


@pytest.mark.parametrize(
    "source",
    [secure_generator(), generator(None), generator(7), np.random.default_rng(0)],
    ids=["secure", "generator()", "generator(seed)", "numpy"],
)
def test_random_sources(source):
    assert isinstance(source, RandomSource)
    assert isinstance(source.random(), float) and source.standard_normal((2, 3)).shape == (2, 3)
    assert source.gamma(2.0, 1.0, 4).shape == (4,) and source.laplace(0.0, 1.0, 5).shape == (5,)
    assert sorted(source.permutation(6)) == list(range(6))
    assert sorted(source.choice(np.arange(5), 5, replace=False)) == list(range(5))


def test_not_a_random_source():
    assert isinstance(CsprngGenerator(), RandomSource)
    assert not isinstance(random.Random(0), RandomSource)  # no standard_normal, gamma, laplace, ...


def _mechanisms(emb):
    return [
        MultivariateLaplace(5.0),
        DistanceTruncated(emb, 5.0, tau=1.0),
        KNNTruncated(emb, 5.0, k=5),
        DensityModulated(emb, 5.0, sigma=1.0, centres=None),
    ]


def test_every_mechanism_is_a_local_mechanism_the_localizer_runs(glove200):
    for mech in _mechanisms(glove200):
        assert isinstance(mech, LocalMechanism), type(mech).__name__
        loc = Localizer(glove200, mech, np.random.default_rng(1), calibrated=True)
        rows = loc.perturb_ids(np.array([0, 1, -1, 5]))
        assert rows.dtype == np.int64 and rows.shape == (4,) and (rows >= 0).all() and (rows < glove200.size).all()
        assert loc.metric() == mech.metric and loc.local_epsilon(3) == mech.local_epsilon(3, loc.diameter)


def test_an_object_without_sample_outputs_is_not_a_local_mechanism():
    class NoiseOnly:  # the pre-protocol shape: additive noise, no sample_outputs
        name, epsilon, metric = "noise-only", 1.0, "d"

        def local_epsilon(self, n_words, diameter):
            return n_words * diameter

        def statement(self, n_words, diameter=None):
            return ""

        def sample_noise(self, n, dim, rng):
            return np.zeros((n, dim))

    assert not isinstance(NoiseOnly(), LocalMechanism)
