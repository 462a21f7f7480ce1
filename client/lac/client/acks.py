"""What the shuffler says of each report submitted: ``ReportAck``, as ``ShufflerClient.submit`` returns it.

Kept free of grpc and protobuf: the wire's ``lac.v1.ReportAck`` is translated in ``lac.client.submit``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["AckStatus", "ReportAck"]


class AckStatus(enum.Enum):
    """Whether the shuffler stored a report with this call or already held it."""

    STORED = "stored"  # durably stored now
    DUPLICATE = "duplicate"  # stored earlier under the same idempotency id (a retry of a call that got through)


@dataclass(frozen=True)
class ReportAck:
    """The shuffler's acknowledgement of one report: durably stored (``status``), under ``idempotency_id``
    (the random id the SDK gave the report for the shuffler; not the id the curator sees)."""

    status: AckStatus
    idempotency_id: bytes
