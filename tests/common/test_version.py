"""``lac --version``: the installed LAC distributions and their versions, from their metadata."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from lac_testkit import run_lac

from lac.common.version import DISTRIBUTIONS, installed, server_version, version_line


def test_lac_version_names_every_installed_distribution(capsys):
    code, out, err = run_lac(capsys, "--version")
    assert code == 0 and not err
    found = installed()
    assert "lac-common" in found and set(found) <= set(DISTRIBUTIONS)
    parts = ", ".join(f"{name} {version(name)}" for name in found)
    assert out == f"lac {version('lac-common')} ({parts})\n" == version_line() + "\n"
    # in this environment every distribution is installed, so the line is as long as it gets (never wrapped)
    assert list(found) == list(DISTRIBUTIONS)


def test_every_distribution_of_the_repository_is_named():
    """lac-analyst was missing from ``lac --version``: the list is checked against the repository's pyproject files."""
    root = Path(__file__).resolve().parents[2]
    names = {tomllib.loads(p.read_text())["project"]["name"] for p in root.glob("*/pyproject.toml")}
    names.add(tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"])
    assert names == set(DISTRIBUTIONS)


def test_version_wins_over_a_missing_command(capsys):
    """``--version`` answers before the required COMMAND is checked, and ``--help`` lists it."""
    assert run_lac(capsys, "--version", "curator")[:2] == (0, version_line() + "\n")
    assert "--version" in run_lac(capsys, "--help")[1]


def test_server_version_names_the_distribution():
    assert server_version("curator") == f"lac-curator {version('lac-curator')}"
    assert server_version("nonexistent") == "lac-nonexistent unknown"
