"""Each deployable installs alone into a fresh virtualenv, with only its own dependencies."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    # component: (import check, packages that must NOT be installed)
    "client": ("import lac.client.localizer, lac.client.submit", {"scipy", "lac-curator", "lac-shuffler",
                                                                   "grpcio-health-checking"}),
    "shuffler": ("import lac.shuffler.server", {"scipy", "lac-client", "lac-curator"}),
    "curator": ("import lac.curator.server, lac.curator.bayesian", {"lac-client", "lac-shuffler"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("component", sorted(CASES))
def test_component_installs_alone(component, tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", str(ROOT / "common"), str(ROOT / component)],
                   check=True, capture_output=True, timeout=900)
    check, forbidden = CASES[component]
    subprocess.run([py, "-c", check], check=True, timeout=120)
    installed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True,
                               text=True).stdout.lower()
    names = {line.split("==")[0] for line in installed.splitlines()}
    assert not (forbidden & names), f"{component} pulled in {forbidden & names}"
    help_text = subprocess.run([str(tmp_path / "venv" / "bin" / "lac"), "--help"], check=True,
                               capture_output=True, text=True).stdout
    assert component in help_text
