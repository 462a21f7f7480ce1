"""Each deployable installs alone into a fresh virtualenv, with only its own dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
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
