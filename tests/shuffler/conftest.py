"""Fixtures of the shuffler tests (helpers live in shuffler_testkit.py; shared fixtures such as
``start_shuffler`` and ``sink`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def start_replica(start_shuffler, tmp_path):
    """Factory: ``start_replica(port, curator, **overrides)`` runs an in-process shuffler on
    127.0.0.1:``port`` (a port chosen first, so that shard lists can name it) with token
    authentication and the tokens file ``tmp_path / "replicas.tokens"`` shared by all replicas.
    Stopped at teardown; ``.stop()`` earlier frees the port for a restart."""

    def start(port: int, curator: str, **overrides):
        overrides.setdefault("state_dir", tmp_path / f"replica-{port}")
        overrides.setdefault("tokens_file", tmp_path / "replicas.tokens")
        overrides.setdefault("auth", "token")
        return start_shuffler(curator, port=port, **overrides)

    return start
