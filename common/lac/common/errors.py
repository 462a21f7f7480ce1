"""Domain errors: what went wrong, in the caller's terms. No transport here.

The servicer boundary (``lac.common.rpc``) maps each class to one gRPC status code; any other
exception is a bug and becomes INTERNAL there, logged once with the RPC name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LacError", "InvalidArgument", "NotFound", "AlreadyExists", "Unauthenticated", "PermissionDenied",
           "ResourceExhausted", "FailedPrecondition", "Unavailable", "DataLoss"]


class LacError(Exception):
    """Base of errors a service reports to its caller with a precise status.

    ``retry_after`` (seconds) is sent as ``retry-after-seconds`` trailing metadata when set.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **extra: Any):
        super().__init__(message)
        self.retry_after = retry_after
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
