"""The SDK without a writable home (a container user, a sandboxed app): ``Localizer.from_preset`` in a fresh
process caches its embedding under ``$LAC_DATA_DIR``, else ``$XDG_CACHE_HOME/lac``, else a private temporary
directory with one warning on stderr; with nowhere to write, a typed ``EmbeddingUnavailable`` naming the settings.

The home is a regular file (nothing can be created below it, not even by root); each data directory's
``embeddings`` links to the session's cache, so no process rebuilds GloVe."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from lac.common.paths import DataDirUnavailable

PRIVATIZE = (
    "from lac.client import Localizer\n"
    "localizer = Localizer.from_preset('balanced')\n"
    "print(localizer.privatize('hello world. my name is Bob and I live in Paris.').text)\n"
)


def _env(tmp_path, **settings: str) -> dict[str, str]:
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("LAC_DATA_DIR", "XDG_CACHE_HOME")}
    return {**env, "HOME": str(home), "TMPDIR": str(tmp_path / "tmp"), **settings}


def _linked(root, glove_cache_dir):
    """``root`` (made 0700, as the temporary fallback requires) whose embedding cache is the session's."""
    root.mkdir(parents=True, mode=0o700)
    (root / "embeddings").symlink_to(glove_cache_dir, target_is_directory=True)
    return root


def _privatize(env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRIVATIZE], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("setting", ["LAC_DATA_DIR", "XDG_CACHE_HOME"])
def test_from_preset_uses_the_setting_without_a_home(setting, tmp_path, glove50k, glove_cache_dir):
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "chosen"
    _linked(root if setting == "LAC_DATA_DIR" else root / "lac", glove_cache_dir)
    run = _privatize(_env(tmp_path, **{setting: str(root)}))
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) == 11 and not run.stderr.strip(), (run.stdout, run.stderr)
    assert not list((tmp_path / "tmp").iterdir())  # nothing fell back to the temporary directory


def test_from_preset_falls_back_to_a_temporary_directory_with_one_warning(tmp_path, glove50k, glove_cache_dir):
    fallback = _linked(tmp_path / "tmp" / f"lac-data-{os.getuid()}", glove_cache_dir)
    run = _privatize(_env(tmp_path))
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) == 11
    (warning,) = run.stderr.strip().splitlines()  # logging's last-resort handler: the one line, on stderr
    assert str(fallback) in warning and "LAC_DATA_DIR" in warning and "~/.cache/lac" in warning


def test_nowhere_to_cache_is_a_typed_error_naming_the_settings(tmp_path, monkeypatch):
    """Even the temporary directory fails (it is below the file too): ``EmbeddingUnavailable``, a
    ``LacClientError``, from the typed ``DataDirUnavailable``."""
    from lac.client import Localizer
    from lac.client.errors import EmbeddingUnavailable, LacClientError

    env = _env(tmp_path)
    for name in ("HOME", "TMPDIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.delenv("LAC_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "home-is-a-file"))
    with pytest.raises(EmbeddingUnavailable) as err:
        Localizer.from_preset("balanced")
    assert isinstance(err.value, LacClientError) and isinstance(err.value.__cause__, DataDirUnavailable)
    assert "LAC_DATA_DIR" in str(err.value) and "XDG_CACHE_HOME" in str(err.value)
