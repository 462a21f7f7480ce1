"""LAC analyst client: ask a curator for differentially private releases of the n-gram distribution and
query them as pandas DataFrames or Arrow tables (``CuratorClient``); notebook views (``notebook``).

A thin distribution (``lac-analyst``): the curator's API over gRPC and nothing of the server. Its errors are
typed by gRPC status code (``AnalystError`` and its subclasses). Quick start::

    from lac.analyst import CuratorClient
    with CuratorClient("localhost:50052", ca="ca.pem", cert="analyst.pem", key="analyst.key") as c:
        top = c.top(c.release(epsilon=1.0).release_id, k=20)
"""

from __future__ import annotations

from lac.analyst.client import (
    AnalystError,
    Budget,
    BudgetExhausted,
    CuratorClient,
    CuratorStatus,
    ExportedReports,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PerplexityResult,
    ReleaseInfo,
    ReleasePreview,
    ReleaseRefused,
    ResourceExhausted,
    Unavailable,
    WindowBudget,
    error_from_rpc,
    new_request_id,
    read_export,
    release_with_retries,
)

__all__ = [
    "AnalystError",
    "Budget",
    "BudgetExhausted",
    "CuratorClient",
    "CuratorStatus",
    "ExportedReports",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PerplexityResult",
    "ReleaseInfo",
    "ReleasePreview",
    "ReleaseRefused",
    "ResourceExhausted",
    "Unavailable",
    "WindowBudget",
    "error_from_rpc",
    "new_request_id",
    "read_export",
    "release_with_retries",
]
