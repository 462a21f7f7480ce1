"""``lac.common.paths.data_dir``: ``$LAC_DATA_DIR``, then ``$XDG_CACHE_HOME/lac``, then ``~/.cache/lac``, then a
temporary directory of this user's own with one warning, else ``DataDirUnavailable`` naming the settings.

An unwritable home is a regular file standing in for it: nothing can be created below a file, not even by root,
so these tests hold for any user."""

from __future__ import annotations

import logging
import os
import stat
import tempfile

import pytest

from lac.common import paths
from lac.common.paths import DataDirUnavailable, data_dir


@pytest.fixture
def no_home(tmp_path, monkeypatch):
    """HOME is a file, LAC_DATA_DIR and XDG_CACHE_HOME are unset, the temporary directory is the test's own."""
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("LAC_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(paths, "_warned", set())
    return tmp


def test_the_settings_in_order(tmp_path, no_home, monkeypatch, caplog):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    with caplog.at_level(logging.WARNING, "lac.common.paths"):
        assert data_dir() == home / ".cache" / "lac" and data_dir().is_dir()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert data_dir() == tmp_path / "xdg" / "lac"
        monkeypatch.setenv("LAC_DATA_DIR", str(tmp_path / "data"))
        assert data_dir() == tmp_path / "data"
    assert not caplog.records  # each was writable: nothing to say


def test_an_unwritable_setting_is_skipped_with_one_warning(tmp_path, no_home, monkeypatch, caplog):
    monkeypatch.setenv("LAC_DATA_DIR", str(tmp_path / "home-is-a-file" / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with caplog.at_level(logging.WARNING, "lac.common.paths"):
        assert data_dir() == data_dir() == tmp_path / "xdg" / "lac"
    (record,) = caplog.records
    assert "LAC_DATA_DIR" in record.message and "Not a directory" in record.message
    assert str(tmp_path / "xdg" / "lac") in record.message


def test_no_writable_home_falls_back_to_a_private_temporary_directory(no_home, caplog):
    with caplog.at_level(logging.WARNING, "lac.common.paths"):
        got = data_dir()
        assert data_dir() == got
    assert got == no_home / f"lac-data-{os.getuid()}"
    assert stat.S_IMODE(got.stat().st_mode) == 0o700
    (record,) = caplog.records  # once per process, however often it is asked
    assert record.levelno == logging.WARNING
    assert str(got) in record.message and "~/.cache/lac" in record.message and "LAC_DATA_DIR" in record.message


def test_a_temporary_directory_that_is_not_ours_is_refused(no_home, tmp_path):
    """A name in a directory everyone writes could be someone else's symlink: it is used only when it is a real
    directory owned by this user; here it is a symlink to a directory, so nothing is left to try."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (no_home / f"lac-data-{os.getuid()}").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(DataDirUnavailable) as err:
        data_dir()
    assert "not a directory of this user's own" in str(err.value)
    assert not list(elsewhere.iterdir())


def test_nowhere_to_write_is_a_typed_error_naming_the_settings(no_home, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "home-is-a-file"))  # the temporary directory too
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    with pytest.raises(DataDirUnavailable) as err:
        data_dir()
    message = str(err.value)
    assert isinstance(err.value, OSError)
    assert "LAC_DATA_DIR" in message and "XDG_CACHE_HOME" in message and "not an absolute path" in message
    assert "~/.cache/lac" in message and "a temporary directory" in message and "Not a directory" in message
