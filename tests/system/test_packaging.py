"""Each deployable installs alone into a fresh virtualenv, with only its own dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_distribution_names():
    """No distribution is called `lac`, an unrelated project on PyPI (each name below was absent from PyPI when
    chosen); the import namespace stays `lac`, and the `lac` command names the suite's distribution."""
    from lac.common.cli import PROVIDERS

    names = {
        d: tomllib.loads((ROOT / d / "pyproject.toml").read_text())["project"]["name"]
        for d in (".", "common", "client", "shuffler", "curator")
    }
    assert names == {
        ".": "lac-privacy-suite",
        "common": "lac-common",
        "client": "lac-client",
        "shuffler": "lac-shuffler",
        "curator": "lac-curator",
    }
    assert PROVIDERS["demo"].startswith("lac-privacy-suite ")


CASES = {
    # component: (import check, packages that must NOT be installed)
    "client": (
        "import lac.client.localizer, lac.client.submit",
        {"scipy", "lac-curator", "lac-shuffler", "grpcio-health-checking"},
    ),
    "shuffler": ("import lac.shuffler.server", {"scipy", "lac-client", "lac-curator"}),
    "curator": ("import lac.curator.server, lac.curator.bayesian", {"lac-client", "lac-shuffler"}),
}


def _install_alone(tmp_path, component, env=None, source=None) -> str:
    """A fresh virtualenv with common and ``component`` (from ``source`` if given) installed; returns its python."""
    venv.create(tmp_path / "venv", with_pip=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", str(ROOT / "common"), str(source or ROOT / component)],
        check=True,
        capture_output=True,
        timeout=900,
        env=env,
    )
    return py


@pytest.mark.slow
@pytest.mark.parametrize("component", sorted(CASES))
def test_component_installs_alone(component, tmp_path):
    py = _install_alone(tmp_path, component)
    check, forbidden = CASES[component]
    subprocess.run([py, "-c", check], check=True, timeout=120)
    installed = subprocess.run(
        [py, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True, text=True
    ).stdout.lower()
    names = {line.split("==")[0] for line in installed.splitlines()}
    assert not (forbidden & names), f"{component} pulled in {forbidden & names}"
    help_text = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "lac"), "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert component in help_text


@pytest.mark.slow
def test_client_installs_without_a_c_compiler(tmp_path):
    """The fused kernel is optional: with no working compiler the SDK installs and runs on BLAS, exactly."""
    # A clean copy: an earlier build's build/ directory would otherwise bring its compiled kernel along.
    source = shutil.copytree(
        ROOT / "client", tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.so", "*.egg-info")
    )
    py = _install_alone(tmp_path, "client", env={**os.environ, "CC": "false", "PIP_NO_CACHE_DIR": "1"}, source=source)
    check = (
        "import numpy as np\n"
        "from lac.client.nearest import NearestIndex, fused_available, reference_nearest_rows\n"
        "assert not fused_available()\n"
        "v = np.random.default_rng(0).standard_normal((500, 20)).astype(np.float32)\n"
        "p = np.random.default_rng(1).standard_normal((50, 20))\n"
        "index = NearestIndex(v)\n"
        "assert index.backend == 'blas'\n"
        "assert (index.query(p) == reference_nearest_rows(p, v)).all()\n"
    )
    subprocess.run([py, "-c", check], check=True, timeout=120)


DISTRIBUTIONS = {
    ".": "lac_privacy_suite",
    "common": "lac_common",
    "client": "lac_client",
    "shuffler": "lac_shuffler",
    "curator": "lac_curator",
}  # folder: wheel name


def test_every_distribution_declares_the_apache_licence():
    """One licence, Apache-2.0 (SPDX, PEP 639), declared by every distribution; a component's LICENSE is a copy
    of the root's (a distribution cannot ship a file above its folder), and the NOTICE says the data are not."""
    licence = (ROOT / "LICENSE").read_text()
    assert licence.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in licence
    for folder in DISTRIBUTIONS:
        pyproject = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())
        assert pyproject["project"]["license"] == "Apache-2.0", folder
        assert "LICENSE" in pyproject["project"]["license-files"], folder
        assert (ROOT / folder / "LICENSE").read_text() == licence, f"{folder}/LICENSE differs from the root's"
        # the SPDX `license` string needs setuptools >= 77; an older build backend would refuse the file
        assert pyproject["build-system"]["requires"] == ["setuptools>=77"], folder
    notice = (ROOT / "NOTICE").read_text()
    for data in ("GloVe", "PDDL-1.0", "WordNet", "GCIDE", "GPL-2.0-or-later", "NOT part of this product"):
        assert data in notice


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_every_wheel_ships_the_licence(folder, tmp_path):
    """The built wheel carries LICENSE (and the suite's the NOTICE) and says License-Expression: Apache-2.0."""
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT / folder)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob(f"{DISTRIBUTIONS[folder]}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(f"{info}/METADATA").decode()
        assert z.read(f"{info}/licenses/LICENSE").decode() == (ROOT / "LICENSE").read_text()
        if folder == ".":
            assert z.read(f"{info}/licenses/NOTICE").decode() == (ROOT / "NOTICE").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
