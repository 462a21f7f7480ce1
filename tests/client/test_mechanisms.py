"""Distribution of the multivariate Laplace noise: Gamma radius, uniform direction.

Statistical tests use fixed seeds (deterministic in CI) and reject at p < 1e-3, so for a
correct sampler a fresh seed would fail each check with probability 1e-3.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from scipy import stats

from lac.client.mechanisms import MultivariateLaplace

P_MIN = 1e-3


@pytest.mark.parametrize("eps", [1.0, 0.5, 3, 1e-3, 1e6])
def test_epsilon_accepted(eps):
    assert MultivariateLaplace(eps).epsilon == float(eps)
    assert isinstance(MultivariateLaplace(eps).epsilon, float)


@pytest.mark.parametrize("eps", [0, -1.0, math.inf, math.nan, "1", True, None])
def test_epsilon_rejected(eps):
    with pytest.raises((ValueError, TypeError)):
        MultivariateLaplace(eps)


def test_shapes_and_frozen():
    m = MultivariateLaplace(2.0)
    rng = np.random.default_rng(0)
    assert m.sample_noise(0, 50, rng).shape == (0, 50)
    z = m.sample_noise(7, 3, rng)
    assert z.shape == (7, 3) and z.dtype == np.float64
    assert m.name == "multivariate-laplace"
    with pytest.raises(Exception):
        m.epsilon = 3.0
    with pytest.raises(ValueError):
        m.sample_noise(-1, 3, rng)
    with pytest.raises(ValueError):
        m.sample_noise(3, 0, rng)


@pytest.mark.parametrize("dim,eps", [(50, 1.0), (50, 7.5), (2, 0.3), (1, 2.0), (300, 0.05)])
def test_radius_is_gamma(dim, eps):
    z = MultivariateLaplace(eps).sample_noise(20_000, dim, np.random.default_rng(dim * 100 + int(eps * 10)))
    r = np.linalg.norm(z, axis=1)
    # One radius per vector: a batch-shared radius would make this KS test fail outright.
    assert stats.kstest(r, stats.gamma(a=dim, scale=1 / eps).cdf).pvalue > P_MIN


@pytest.mark.parametrize("dim", [2, 3, 50])
def test_direction_uniform(dim):
    rng = np.random.default_rng(dim)
    n = 20_000
    z = MultivariateLaplace(1.3).sample_noise(n, dim, rng)
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    # Mean of n uniform unit vectors: n*d*|mean|^2 is approximately chi2(d).
    assert stats.chi2(dim).sf(n * dim * np.sum(u.mean(0) ** 2)) > P_MIN
    # Projection on a fixed axis (a coordinate axis and an oblique one): (1+x)/2 ~ Beta((d-1)/2, (d-1)/2).
    oblique = np.random.default_rng(1000 + dim).standard_normal(dim)
    oblique /= np.linalg.norm(oblique)
    law = stats.beta((dim - 1) / 2, (dim - 1) / 2)
    for axis_proj in (u[:, 0], u @ oblique):
        assert stats.kstest((1 + axis_proj) / 2, law.cdf).pvalue > P_MIN


def test_direction_independent_of_radius():
    z = MultivariateLaplace(1.0).sample_noise(20_000, 50, np.random.default_rng(21))
    r = np.linalg.norm(z, axis=1)
    u1 = z[:, 0] / r
    # Spearman correlation of radius with |u_1|; independence gives p-values uniform.
    assert stats.spearmanr(r, np.abs(u1)).pvalue > P_MIN


def test_one_dimension_is_laplace():
    eps = 2.5
    z = MultivariateLaplace(eps).sample_noise(20_000, 1, np.random.default_rng(3))[:, 0]
    assert stats.kstest(z, stats.laplace(scale=1 / eps).cdf).pvalue > P_MIN


def test_density_matches_exp_minus_eps_norm_in_2d():
    # In 2-D the density exp(-eps|z|) gives P(|z| <= t) = 1 - (1 + eps t) exp(-eps t).
    eps, t = 0.8, 1.7
    z = MultivariateLaplace(eps).sample_noise(50_000, 2, np.random.default_rng(4))
    frac = np.mean(np.linalg.norm(z, axis=1) <= t)
    expected = 1 - (1 + eps * t) * math.exp(-eps * t)
    assert stats.binomtest(int(frac * 50_000), 50_000, expected).pvalue > P_MIN


def test_statement():
    m = MultivariateLaplace(2.0)
    s = m.statement(12, diameter=3.5)
    assert "Pr[M(w)=y] ≤ exp(ε·d(w,w'))·Pr[M(w')=y]" in s
    assert "n = 12" in s and "ε = 2 per word" in s
    assert "= 84" in s  # 12 * 2 * 3.5
    assert m.local_epsilon(12, 3.5) == 84.0
    assert "diam(vocabulary)" in m.statement(3)
    assert "not hidden" in s
    with pytest.raises(ValueError):
        m.statement(-1)


@pytest.mark.slow
@pytest.mark.parametrize("dim,eps", [(50, 1.0), (50, 20.0), (384, 0.5)])
def test_radius_and_direction_large_sample(dim, eps):
    n = 20_000_000 // dim  # 400k vectors at d=50
    z = MultivariateLaplace(eps).sample_noise(n, dim, np.random.default_rng(dim + int(eps)))
    r = np.linalg.norm(z, axis=1)
    assert stats.kstest(r, stats.gamma(a=dim, scale=1 / eps).cdf).pvalue > P_MIN
    u = z / r[:, None]
    assert stats.kstest((1 + u[:, 7]) / 2, stats.beta((dim - 1) / 2, (dim - 1) / 2).cdf).pvalue > P_MIN
    assert stats.chi2(dim).sf(n * dim * np.sum(u.mean(0) ** 2)) > P_MIN


# -- the registry of local mechanisms (lac.client.mechanisms.LOCAL_KINDS) ------------------------------------


def _client_parser() -> argparse.ArgumentParser:
    from lac.client.cli import register

    parser = argparse.ArgumentParser(prog="lac")
    register(parser.add_subparsers())
    return parser


def test_every_registered_local_mechanism_is_built_under_the_name_a_deployment_gives_it(glove200):
    emb = glove200
    from lac.client.calibrate import mechanism_factory
    from lac.client.mechanisms import LOCAL_KINDS
    from lac.common.deployment import LOCAL_MECHANISMS

    assert set(LOCAL_MECHANISMS) == {kind.name for kind in LOCAL_KINDS.values()}
    for option, kind in LOCAL_KINDS.items():
        mechanism = mechanism_factory(option, emb, tau=1.0, k=5)(3.0)
        assert mechanism.name == kind.name and mechanism.epsilon == 3.0, option
    with pytest.raises(ValueError, match="unknown mechanism 'bogus'; known: laplace, truncated, knn, modulated"):
        mechanism_factory("bogus", emb)


def test_a_local_mechanism_added_to_the_registry_is_offered_and_built_by_the_commands(glove200, monkeypatch, capsys):
    """The registry is the one place: a toy kind added there is a --mechanism choice of both commands, in
    their help, and what calibrate builds."""
    from lac.client import mechanisms
    from lac.client.calibrate import mechanism_factory

    toy = mechanisms.LocalKind(
        "toy", "multivariate-laplace", "a toy for this test", lambda *a, **k: MultivariateLaplace
    )
    monkeypatch.setitem(mechanisms.LOCAL_KINDS, "toy", toy)
    parser = _client_parser()
    for command in (["privatize", "-"], ["calibrate"]):
        assert parser.parse_args(["client", *command, "--mechanism", "toy"]).mechanism == "toy"
    with pytest.raises(SystemExit):
        parser.parse_args(["client", "calibrate", "--help"])
    assert "toy: a toy for this test" in " ".join(capsys.readouterr().out.split())
    assert mechanism_factory("toy", glove200)(2.0).epsilon == 2.0
    monkeypatch.delitem(mechanisms.LOCAL_KINDS, "toy")
    with pytest.raises(SystemExit):
        _client_parser().parse_args(["client", "calibrate", "--mechanism", "toy"])
