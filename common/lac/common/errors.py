"""Domain errors: what went wrong, in the caller's terms. No transport here.

The servicer boundary (``lac.common.rpc``) maps each class to one gRPC status code; any other
exception is a bug and becomes INTERNAL there, logged once with the RPC name.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "LacError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "Unauthenticated",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Unavailable",
    "DataLoss",
    "RejectReason",
    "ErrorReason",
    "RemoteError",
    "ERROR_REASON_KEY",
]


class RejectReason(StrEnum):
    """Why a report was refused (shuffler) or quarantined/dropped (curator): the label of the
    ``reject:<reason>`` counters, of the ``reason`` metrics label and of the curator's quarantine
    rows. The values are stored: never change one."""

    # The envelope (lac.common.envelope): its shape (both roles) and opening it (curator).
    MALFORMED = "malformed"  # bytes that do not parse (a request, a SealedPayload, a ReportContent)
    EMPTY = "empty"
    OVERSIZED = "oversized"
    BAD_SIZE = "bad_size"  # a sealed payload whose length is no padding bucket's
    BAD_KEY_ID = "bad_key_id"
    BAD_PADDING = "bad_padding"
    BAD_REPORT_ID = "bad_report_id"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    PLAINTEXT_REFUSED = "plaintext_refused"
    UNKNOWN_KEY = "unknown_key"
    DECRYPT_FAILED = "decrypt_failed"
    # The shuffler's Submit.
    INVALID_ARGUMENT = "invalid_argument"  # a request refused whole (no reason more precise)
    UNSPECIFIED_ENCODING = "unspecified_encoding"
    QUOTA = "quota"  # the client's reports per accounting window are used up
    PERIOD_CAP = "period_cap"  # the client contributed to its cap of windows in this period already
    LOG_FULL = "log_full"
    OVERLOADED = "overloaded"  # too many bytes wait for a durable commit
    STORAGE_UNAVAILABLE = "storage_unavailable"
    WRONG_SHARD = "wrong_shard"
    SHARDS_NOT_EFFECTIVE = "shards_not_effective"  # the shard list applies from a later window
    SHARD_LIST_MISMATCH = "shard_list_mismatch"  # the client was routed by another shard list than this replica's
    DEPLOYMENT_MISMATCH = "deployment_mismatch"  # this shuffler's privacy unit is not the curator's
    # The curator's checks of an opened report against the published deployment.
    INVALID = "invalid"  # report id length, sentence count or token rules
    MECHANISM_NOT_ALLOWED = "mechanism_not_allowed"
    EPSILON_TOO_LARGE = "epsilon_too_large"
    EPSILON_NOT_EXACT = "epsilon_not_exact"  # a smaller ε than the one a deployment with exact_epsilon takes
    EMBEDDING_MISMATCH = "embedding_mismatch"
    TOO_MANY_WORDS = "too_many_words"
    INTERNAL = "internal"  # an unexpected error while opening (a bug): quarantined, logged
    REPLAYED_REPORT_ID = "replayed_report_id"  # dropped, not quarantined (its first copy is stored)


ERROR_REASON_KEY = "lac-error-reason"  # the trailing metadata key that carries an ``ErrorReason``


class ErrorReason(StrEnum):
    """Why a call failed, when its status code alone does not say it: sent as ``ERROR_REASON_KEY`` trailing
    metadata so that a client (``lac.analyst``) tells these errors apart by it, never by the message text.
    The values are a wire contract: never change one."""

    BUDGET_EXHAUSTED = "budget_exhausted"  # FAILED_PRECONDITION: a release would overspend a window's budget
    RELEASE_REFUSED = "release_refused"  # FAILED_PRECONDITION: the accuracy check predicts the noise swamps the signal
    # FAILED_PRECONDITION to IngestBatch: the batch belongs (by its last window) to an accounting window whose reports
    # were exported already; it will never be accepted, so a shuffler should set it aside rather than retry it
    WINDOW_EXPORTED = "window_exported"
    CHANNEL_NOT_READY = "channel_not_ready"  # UNAVAILABLE: the release needs the local channel, still being sampled
    # UNAVAILABLE to Submit: refused before anything was stored (overloaded, log full, storage failing, stopping), so
    # the SDK may send it to a replica of another report log; without it, an UNAVAILABLE Submit may have stored
    NOTHING_STORED = "nothing_stored"


class LacError(Exception):
    """Base of errors a service reports to its caller with a precise status.

    ``retry_after`` (seconds) is sent as ``retry-after-seconds`` trailing metadata when set, ``error_reason``
    as ``lac-error-reason`` (``ERROR_REASON_KEY``).
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        error_reason: ErrorReason | None = None,
        **extra: Any,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.error_reason = error_reason
        self.extra = extra


class InvalidArgument(LacError):
    """Malformed, oversized or out-of-range input."""


class NotFound(LacError):
    """An unknown release or other named object."""


class AlreadyExists(LacError):
    """An object that must be new already exists."""


class Unauthenticated(LacError):
    """No credentials, or credentials that identify no one."""


class PermissionDenied(LacError):
    """A known caller whose roles do not include the one this call needs."""


class ResourceExhausted(LacError):
    """A quota is used up (retry after ``retry_after`` seconds)."""


class FailedPrecondition(LacError):
    """The system is not in a state that allows the request (e.g. the privacy budget is spent)."""


class Unavailable(LacError):
    """A transient condition (full log, unreachable peer, full disk): retry later."""


class DataLoss(LacError):
    """Stored data that should exist is missing or corrupt."""


class RemoteError(Exception):
    """An error a LAC service returned, as a client library raises it (``lac.analyst.AnalystError``): ``code``
    is the gRPC status name, ``details`` the service's message. ``lac.common.cli`` prints it as a one-line
    ``CODE: details``, the same as a raw gRPC error."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
