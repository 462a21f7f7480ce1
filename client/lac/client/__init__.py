"""LAC client SDK: privatize text on the device (word-level metric DP) and submit the reports.

Quick start::

    from lac.client import Localizer

    localizer = Localizer.from_preset("balanced")  # GloVe 6B 50d (50,000 words), ε = 8 per word
    report = localizer.privatize("hello world. my name is Bob and I live in Paris.")
    print(report.text)

Submitting (L and the embedding from the curator's deployment, ε at most the preset's)::

    from lac.client import ShufflerClient

    with ShufflerClient.connect(ADDRESS, curator_key="curator.pub", ca="ca.pem", token=TOKEN) as client:
        localizer = client.localizer("balanced")
        acks = client.submit(localizer.privatize(message))  # [ReportAck(status=AckStatus.STORED, ...)]

From asyncio code, ``AsyncShufflerClient`` (``lac.client.aio``) takes the same arguments and awaits
the same methods (``await client.submit(...)``).

Only the exceptions load with the package; every other name loads on first use, so importing
``lac.client`` costs neither numpy nor grpc (``Localizer`` brings numpy, ``ShufflerClient`` grpc).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lac.client.errors import (
    AuthenticationError,
    Cancelled,
    DeploymentMismatch,
    EmbeddingUnavailable,
    InvalidReportError,
    LacClientError,
    LacClientWarning,
    NotRetryableError,
    PartlyUnsupportedText,
    QuotaExceeded,
    RetryableError,
    UnsupportedText,
)

if TYPE_CHECKING:
    from lac.client.acks import AckStatus, ReportAck
    from lac.client.aio import AsyncShufflerClient
    from lac.client.embedding import Embedding, glove_default
    from lac.client.formats import open_embedding
    from lac.client.localizer import MAX_TEXT_CHARS, Localizer, PrivatizedReport
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.modulated import DensityModulated
    from lac.client.presets import DEFAULT_PRESET, PRESETS, Preset, get_preset
    from lac.client.submit import ShufflerClient
    from lac.client.truncated import DistanceTruncated, KNNTruncated
    from lac.common.deployment import Deployment

_LAZY = {
    "Localizer": "lac.client.localizer",
    "PrivatizedReport": "lac.client.localizer",
    "MAX_TEXT_CHARS": "lac.client.localizer",
    "MultivariateLaplace": "lac.client.mechanisms",
    "DistanceTruncated": "lac.client.truncated",
    "KNNTruncated": "lac.client.truncated",
    "DensityModulated": "lac.client.modulated",
    "Embedding": "lac.client.embedding",
    "glove_default": "lac.client.embedding",
    "open_embedding": "lac.client.formats",
    "ShufflerClient": "lac.client.submit",
    "AsyncShufflerClient": "lac.client.aio",
    "ReportAck": "lac.client.acks",
    "AckStatus": "lac.client.acks",
    "Preset": "lac.client.presets",
    "PRESETS": "lac.client.presets",
    "DEFAULT_PRESET": "lac.client.presets",
    "get_preset": "lac.client.presets",
    "Deployment": "lac.common.deployment",
}

__all__ = [
    # privatizing
    "Localizer",
    "PrivatizedReport",
    "MAX_TEXT_CHARS",
    "Preset",
    "PRESETS",
    "DEFAULT_PRESET",
    "get_preset",
    # mechanisms
    "MultivariateLaplace",
    "DistanceTruncated",
    "KNNTruncated",
    "DensityModulated",
    # embeddings
    "Embedding",
    "glove_default",
    "open_embedding",
    # submitting
    "ShufflerClient",
    "AsyncShufflerClient",
    "ReportAck",
    "AckStatus",
    "Deployment",
    # errors
    "LacClientError",
    "Cancelled",
    "RetryableError",
    "QuotaExceeded",
    "NotRetryableError",
    "AuthenticationError",
    "InvalidReportError",
    "UnsupportedText",
    "DeploymentMismatch",
    "EmbeddingUnavailable",
    # warnings
    "LacClientWarning",
    "PartlyUnsupportedText",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
