"""The documentation site builds in strict mode (no broken link, anchor, snippet or API reference), and its
pages hold what they include: the README's sections and the API reference rendered from the docstrings."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _text(site: Path, page: str) -> str:
    """The visible text of a built page's article."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    article = raw[raw.find("<article") : raw.find("</article>")]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", article)).split())


@pytest.mark.slow  # about 3 s of CPU, 4-6 s on a busy machine
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "WARNING" not in out.stderr, out.stderr[-4000:]

    # The README's sections arrive through scripts/mkdocs_hooks.py (a missing or empty section fails the build).
    assert "from_preset" in _text(site, "app") and "median N_w" in _text(site, "app")
    privacy = _text(site, "privacy")
    assert "No RPC returns a pre-noise value" in privacy and "Deployment: the curator's operator publishes" in privacy
    operator = (site / "operator" / "index.html").read_text(encoding="utf-8")
    assert "lac keys curator --dir keys/curator" in _text(site, "operator") and 'href="spark/"' in operator
    assert "CuratorClient" in _text(site, "analyst") and "BudgetExhausted" in _text(site, "analyst/quickstart")
    # The API reference is rendered from the docstrings.
    client = _text(site, "reference/client")
    for name in ("Localizer", "ShufflerClient", "from_preset", "RetryableError", "EmbeddingUnavailable"):
        assert name in client, name
    curator = _text(site, "reference/analyst")
    for name in ("CuratorClient", "export_parquet", "next_word", "BudgetExhausted"):
        assert name in curator, name
    assert "Guarantee" in _text(site, "reference/privacy") and "PrivacyUnit" in _text(site, "reference/privacy")
