"""Exactness of the nearest-row search (fused kernel and BLAS backends) against the float64 brute force."""

from __future__ import annotations

import hashlib
import platform
import sys

import numpy as np
import pytest

from lac.client import nearest
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import NearestIndex, fused_available, sqdist64

BACKEND = "auto"
_REFERENCE: dict = {}


def reference_nearest_rows(points, vectors):
    """``lac.client.nearest.reference_nearest_rows``, computed once per (points, vectors) in this module:
    every test runs once per backend on the same inputs, and the brute force is the slow part."""
    key = tuple(
        (a.shape, a.dtype.str, hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).digest())
        for a in (np.asarray(points), np.asarray(vectors))
    )
    if key not in _REFERENCE:
        _REFERENCE[key] = nearest.reference_nearest_rows(points, vectors)
    return _REFERENCE[key].copy()


@pytest.fixture(autouse=True, params=["fused", "blas"])
def backend(request, monkeypatch):
    """Every test in this module runs once per backend."""
    if request.param == "fused" and not fused_available():
        pytest.skip("fused kernel not available on this machine")
    monkeypatch.setattr(sys.modules[__name__], "BACKEND", request.param)
    return request.param


def nearest_rows(points, vectors, norms2=None, block=None):
    return nearest.nearest_rows(points, vectors, norms2, block=block, backend=BACKEND)


def _noisy_points(vectors, eps, n, rng):
    ids = rng.integers(0, len(vectors), n)
    return vectors[ids].astype(np.float64) + MultivariateLaplace(eps).sample_noise(n, vectors.shape[1], rng)


@pytest.mark.parametrize("eps", [0.3, 1.0, 3.0, 10.0, 30.0, 1e3])
def test_exact_on_glove_plus_noise(glove10k, eps):
    rng = np.random.default_rng(int(eps * 1000))
    v = glove10k.vectors
    points = _noisy_points(v, eps, 200, rng)
    got = nearest_rows(points, v, glove10k.norms2)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, reference_nearest_rows(points, v))


def test_exact_on_50k_vocabulary(glove50k):
    rng = np.random.default_rng(7)
    points = _noisy_points(glove50k.vectors, 5.0, 40, rng)
    np.testing.assert_array_equal(
        nearest_rows(points, glove50k.vectors), reference_nearest_rows(points, glove50k.vectors)
    )


def _near_tie_points(v, rng, n_pairs=80):
    """Midpoints of close row pairs, nudged by 0 and by tiny steps along the pair direction."""
    v64 = v.astype(np.float64)
    a = rng.choice(len(v), n_pairs, replace=False)
    scores = (v64**2).sum(1)[None, :] - 2 * v64[a] @ v64.T
    scores[np.arange(n_pairs), a] = np.inf
    b = scores.argmin(axis=1)  # a close neighbour of each a (approximate is fine here)
    mid = (v64[a] + v64[b]) / 2
    step = v64[b] - v64[a]
    pts = [mid + t * step for t in (0.0, 1e-9, -1e-9, 1e-7, -1e-7, 1e-6)]
    return np.concatenate(pts)


def test_exact_on_constructed_near_ties(glove10k):
    rng = np.random.default_rng(11)
    v = glove10k.vectors
    points = _near_tie_points(v, rng)
    ref = reference_nearest_rows(points, v)
    np.testing.assert_array_equal(nearest_rows(points, v), ref)
    # The test has teeth: the plain float32 GEMM ranking gets some of these wrong.
    naive = np.argmin(glove10k.norms2[None, :] - 2 * points.astype(np.float32) @ v.T, axis=1)
    assert np.any(naive != ref)


def test_exact_ties_go_to_lowest_index(glove_prefix):
    v = np.array(glove_prefix(300).vectors)
    v[250] = v[17]  # exact duplicate rows: equal distances to every point
    v[251] = v[3]
    rng = np.random.default_rng(5)
    points = np.concatenate([v[[17, 250, 3, 251]].astype(np.float64), _noisy_points(v, 20.0, 300, rng)])
    got = nearest_rows(points, v)
    np.testing.assert_array_equal(got, reference_nearest_rows(points, v))
    assert list(got[:4]) == [17, 17, 3, 3]
    assert not np.isin(got, [250, 251]).any()


def test_rows_are_their_own_nearest(glove10k):
    ids = np.arange(0, glove10k.size, 37)
    np.testing.assert_array_equal(nearest_rows(glove10k.vectors[ids], glove10k.vectors), ids)


@pytest.mark.parametrize("block", [1, 3, 64, None])
def test_block_size_does_not_change_result(glove10k, block):
    rng = np.random.default_rng(3)
    points = _noisy_points(glove10k.vectors, 2.0, 100, rng)
    ref = nearest_rows(points, glove10k.vectors, block=10_000)
    np.testing.assert_array_equal(nearest_rows(points, glove10k.vectors, block=block), ref)


def test_float32_points_are_used_exactly(glove10k):
    rng = np.random.default_rng(4)
    points = _noisy_points(glove10k.vectors, 10.0, 100, rng).astype(np.float32)
    np.testing.assert_array_equal(
        nearest_rows(points, glove10k.vectors), reference_nearest_rows(points, glove10k.vectors)
    )


def test_far_points_use_float64_path(glove_prefix):
    v = glove_prefix(500).vectors
    rng = np.random.default_rng(8)
    points = rng.standard_normal((50, v.shape[1])) * 1e20
    np.testing.assert_array_equal(nearest_rows(points, v), reference_nearest_rows(points, v))


def test_float64_vectors(glove_prefix):
    v = np.asarray(glove_prefix(1000).vectors, dtype=np.float64) + 1e-9  # not float32-representable
    rng = np.random.default_rng(9)
    points = _noisy_points(v, 5.0, 100, rng)
    np.testing.assert_array_equal(nearest_rows(points, v), reference_nearest_rows(points, v))


def test_input_validation(glove200):
    v = glove200.vectors
    assert nearest_rows(np.empty((0, 50)), v).shape == (0,)
    with pytest.raises(ValueError):
        nearest_rows(np.zeros((3, 49)), v)
    with pytest.raises(ValueError):
        nearest_rows(np.full((1, 50), np.nan), v)
    with pytest.raises(ValueError):
        nearest_rows(np.zeros((1, 50)), v, norms2=glove200.norms2 * 1.01)  # not the squared norms
    with pytest.raises(ValueError):
        nearest_rows(np.zeros((1, 50)), v, block=0)


def test_sqdist64_matches_definition():
    rng = np.random.default_rng(0)
    p, q = rng.standard_normal((2, 5, 7))
    np.testing.assert_array_equal(sqdist64(p, q), ((p - q) ** 2).sum(axis=1))


@pytest.mark.parametrize("tile_entries,block", [(64, 8), (1000, 50), (1 << 20, 512)])
def test_exact_across_vocabulary_tiles(glove10k, monkeypatch, tile_entries, block):
    """Ties and near-ties whose rows fall in different vocabulary tiles are still resolved exactly."""
    monkeypatch.setattr(nearest, "_TILE_ENTRIES", tile_entries)
    monkeypatch.setattr(nearest, "_MIN_TILE", 4)
    v = np.array(glove10k.vectors[:3000])
    v[2999] = v[5]  # duplicates far apart: always in different tiles
    v[1500] = v[1499]  # adjacent duplicates: same tile or straddling a boundary
    rng = np.random.default_rng(12)
    points = np.concatenate(
        [v[[5, 2999, 1499, 1500]].astype(np.float64), _near_tie_points(v, rng, 40), _noisy_points(v, 10.0, 200, rng)]
    )
    got = nearest_rows(points, v, block=block)
    np.testing.assert_array_equal(got, reference_nearest_rows(points, v))
    assert list(got[:4]) == [5, 5, 1499, 1499]


@pytest.mark.slow  # ~6 s of brute force; the same near ties on 10k words run in the fast loop (above)
def test_near_ties_on_50k_vocabulary(glove50k):
    rng = np.random.default_rng(13)
    v = glove50k.vectors
    points = _near_tie_points(v, rng, 30)
    np.testing.assert_array_equal(nearest_rows(points, v, glove50k.norms2), reference_nearest_rows(points, v))


@pytest.mark.parametrize("size,l2_bytes,block", [(3000, 1, 7), (2999, 3200 * 5, 1000), (2993, 1 << 20, 4096)])
def test_fused_lanes_panels_and_chunks(glove10k, monkeypatch, size, l2_bytes, block):
    """Duplicates in the same lane and across lanes, a partial last panel, odd point counts, any chunking."""
    monkeypatch.setattr(nearest, "_L2_BYTES", l2_bytes)
    v = np.array(glove10k.vectors[:size])
    v[5 + 16 * 150] = v[5]  # same lane (row mod 16), far apart
    v[7] = v[6]  # neighbouring lanes of one panel
    v[size - 1] = v[2]  # in the partial last panel when size % 16 != 0
    rng = np.random.default_rng(14)
    points = np.concatenate(
        [v[[5, 6, 2]].astype(np.float64), _near_tie_points(v, rng, 30), _noisy_points(v, 10.0, 301, rng)]
    )
    got = nearest_rows(points, v, block=block)
    np.testing.assert_array_equal(got, reference_nearest_rows(points, v))
    assert list(got[:3]) == [5, 6, 2]


def test_backend_choice(glove200, backend):
    assert NearestIndex(glove200.vectors, backend=backend).backend == backend
    assert NearestIndex(glove200.vectors).backend == ("fused" if fused_available() else "blas")
    with pytest.raises(ValueError, match="backend"):
        NearestIndex(glove200.vectors, backend="hnsw")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return set()


def _has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= _cpu_flags()


@pytest.mark.skipif(platform.machine() != "x86_64" or not _has_avx2_fma(), reason="needs x86-64 with AVX2/FMA")
def test_fused_kernel_is_built_here():
    """On this kind of machine the install must have compiled the kernel (a silent BLAS fallback is slower)."""
    assert fused_available()


def test_every_fused_path_gives_the_exact_answer(glove50k, backend):
    """The AVX-512 and AVX2 paths of the fused kernel (both, where this CPU runs them) agree with the float64
    brute force on noisy points of the channel's workload (ε = 8 over 50k words), ties and blocks included."""
    if backend != "fused":
        pytest.skip("fused paths only")
    rng = np.random.default_rng(8)
    v = glove50k.vectors
    points = _noisy_points(v, 8.0, 301, rng)  # not a multiple of 12: the AVX-512 path's 6-query tail runs
    points[-1] = v[7]  # an exact hit
    want = reference_nearest_rows(points, v)
    for isa in nearest.fused_isas():
        np.testing.assert_array_equal(NearestIndex(v, glove50k.norms2, isa=isa).query(points), want, err_msg=isa)
    with pytest.raises(ValueError, match="isa"):
        NearestIndex(v, isa="neon")


@pytest.mark.skipif(platform.machine() != "x86_64" or "avx512f" not in _cpu_flags(), reason="needs AVX-512")
def test_avx512_path_is_chosen_where_the_cpu_has_it(glove200):
    assert NearestIndex(glove200.vectors).isa == "avx512"
