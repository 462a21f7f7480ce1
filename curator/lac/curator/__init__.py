"""LAC curator: n-gram aggregation, central-DP releases, the curator service, and the analyst API.

``from lac.curator import CuratorClient`` gives the analyst's client (``lac.curator.analyst.client``). It is
imported lazily, on first access, so ``import lac.curator`` stays cheap (no gRPC, pandas or pyarrow).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "AnalystError",
    "BudgetExhausted",
    "CuratorClient",
    "CuratorStatus",
    "ExportedReports",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PerplexityResult",
    "ReleaseInfo",
    "ReleasePreview",
    "ReleaseRefused",
    "Unavailable",
    "WindowBudget",
]
_LAZY = dict.fromkeys(__all__, "lac.curator.analyst.client")

if TYPE_CHECKING:  # pragma: no cover
    from lac.curator.analyst.client import (
        AnalystError,
        BudgetExhausted,
        CuratorClient,
        CuratorStatus,
        ExportedReports,
        InvalidArgument,
        NotFound,
        PermissionDenied,
        PerplexityResult,
        ReleaseInfo,
        ReleasePreview,
        ReleaseRefused,
        Unavailable,
        WindowBudget,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lac.curator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
