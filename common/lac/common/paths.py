"""Where LAC keeps prepared data (embedding caches, corpora) on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """``$LAC_DATA_DIR`` or ``~/.cache/lac``; created on first use."""
    root = Path(os.environ.get("LAC_DATA_DIR") or Path.home() / ".cache" / "lac")
    root.mkdir(parents=True, exist_ok=True)
    return root
