"""The SDK's exceptions: one tree, so an app catches ``LacClientError`` (or a branch of it) and
never a raw ``grpc.RpcError``.

::

    LacClientError
    ├── Cancelled               the app cancelled a long privatize_many (progress callback or cancel event)
    ├── RetryableError          UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED (after the client's own retries)
    │   └── QuotaExceeded       RESOURCE_EXHAUSTED with a retry-after: this client's reports per window (or
    │                           windows per period) are used up
    └── NotRetryableError       any other status (FAILED_PRECONDITION, INTERNAL, ...)
        ├── AuthenticationError UNAUTHENTICATED, PERMISSION_DENIED
        ├── InvalidReportError  INVALID_ARGUMENT; RESOURCE_EXHAUSTED without a retry-after (a request over the
        │                       shuffler's message size)
        │   └── UnsupportedText a text with no word the tokeniser reads, refused on the device (also a ValueError)
        ├── DeploymentMismatch  a Localizer the curator's deployment would not accept (also a ValueError)
        └── EmbeddingUnavailable the embedding's wheel or reader is not installed (also a RuntimeError)

    LacClientWarning            (a UserWarning)
    └── PartlyUnsupportedText   texts privatized on their readable words only (letters of another script dropped)

Errors from a server carry ``status_code`` (a ``grpc.StatusCode``), ``status_details`` (the
server's message) and ``trailing`` (its trailing metadata); ``RetryableError.retry_after`` is
the server's ``retry-after-seconds`` hint, if any; ``QuotaExceeded.acks`` are the acks of the reports
the call stored before the quota refused the rest. ``ShufflerClient`` raises them as
subclasses of ``grpc.RpcError`` too (with ``code()``, ``details()``, ``trailing_metadata()``),
so code written against raw gRPC keeps working.

This module imports neither grpc nor numpy (only ``lac.common.text``, for what a word is).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lac.common.text import WORD_CHARACTERS

if TYPE_CHECKING:
    from lac.client.acks import ReportAck

# Trailing metadata as (key, value) pairs. grpc's stubs type the entries of an RpcError's as an opaque
# ``_Metadatum`` (at run time a (key, value) namedtuple), hence ``Any`` where both must agree.
Metadata = tuple[tuple[str, str | bytes], ...]

__all__ = [
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
    "LacClientWarning",
    "PartlyUnsupportedText",
    "error_class_for_status",
]


class LacClientError(Exception):
    """Base of every error the client SDK raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        status_code: Any = None,
        status_details: str = "",
        trailing: Iterable[tuple[str, str | bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.status_code = status_code  # grpc.StatusCode, or None for a local error
        self.status_details = status_details  # the server's message
        self.trailing = tuple(trailing)  # the server's trailing metadata: (key, value) pairs

    # grpc.Call-style accessors, so ``except grpc.RpcError as e: e.code()`` code keeps working.
    def code(self) -> Any:
        """The gRPC status code (None for an error raised on the device; ``Any`` keeps this module free of grpc)."""
        return self.status_code

    def details(self) -> str:
        """The server's status message."""
        return self.status_details

    def trailing_metadata(self) -> tuple[Any, ...]:
        """The server's trailing metadata: (key, value) pairs."""
        return self.trailing


class Cancelled(LacClientError):
    """The app cancelled ``Localizer.privatize_many`` (its ``progress`` callback returned False, or its
    ``cancel`` event was set): nothing was returned and nothing was sent. ``done`` of ``total`` texts had
    been privatized; those reports were discarded on the device, so privatizing the texts again later
    releases nothing twice."""

    def __init__(self, message: str, *, done: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.done, self.total = done, total


class RetryableError(LacClientError):
    """A transient failure: trying again later may succeed (after ``retry_after`` seconds if set)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class QuotaExceeded(RetryableError):
    """RESOURCE_EXHAUSTED: this client's reports for the accounting window are used up. Retry after
    ``retry_after`` seconds (the next window). ``submit`` stores reports in order as long as the quota
    allows, so ``acks`` (``ReportAck``s) are those of the first ``len(acks)`` reports given, all stored;
    none after them was."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.acks: tuple[ReportAck, ...] = ()  # set by submit: the acks of the reports stored before the refusal


class NotRetryableError(LacClientError):
    """Retrying the same request will fail the same way."""


class AuthenticationError(NotRetryableError):
    """UNAUTHENTICATED (no, unknown or malformed token) or PERMISSION_DENIED (a known caller
    without the client role)."""


class InvalidReportError(NotRetryableError):
    """INVALID_ARGUMENT: the shuffler refused the request (malformed, oversized or plaintext reports); or
    RESOURCE_EXHAUSTED without a retry-after: the request is over the shuffler's message size (send fewer reports
    per call)."""


class UnsupportedText(InvalidReportError, ValueError):
    """A text (or report) with no word the tokeniser reads (another script, emoji only, ...):
    refused on the device before anything is sealed or sent, so no quota is spent. ``where``
    names it in the message; ``index`` is its position among the texts given."""

    def __init__(self, where: str, *, index: int = 0) -> None:
        super().__init__(f"{where} has no word to privatize: words are made of {WORD_CHARACTERS}; nothing was sent")
        self.where, self.index = where, index


class DeploymentMismatch(NotRetryableError, ValueError):
    """This Localizer's mechanism, ε or embedding is not what the curator's deployment accepts,
    or the deployment names an embedding the SDK cannot load."""


class EmbeddingUnavailable(NotRetryableError, RuntimeError):
    """The requested embedding's source (wheel or reader library) is not installed."""


class LacClientWarning(UserWarning):
    """Base of the warnings the SDK gives (``warnings.warn``): something was done, but not all of it."""


class PartlyUnsupportedText(LacClientWarning):
    """Texts with letters or digits the tokeniser does not read (another script, accented letters such as
    é) besides words it does: they were privatized on their words of a-z and 0-9 only, and the rest was
    dropped on the device (never sent). ``indexes`` are their positions among the texts given."""

    def __init__(self, indexes: Iterable[int], total: int) -> None:
        self.indexes, self.total = tuple(indexes), total
        shown = ", ".join(str(i + 1) for i in self.indexes[:10]) + (", ..." if len(self.indexes) > 10 else "")
        which = "the text has" if total == 1 else f"{len(self.indexes)} of {total} texts (text {shown}) have"
        super().__init__(
            f"{which} letters or digits outside a-z and 0-9 (another script, or accented letters such as é): "
            "only the words of a-z and 0-9 were privatized; the other characters were dropped on the device"
        )


_BY_STATUS: dict[str, type[LacClientError]] = {
    "UNAVAILABLE": RetryableError,
    "DEADLINE_EXCEEDED": RetryableError,
    "CANCELLED": RetryableError,
    "RESOURCE_EXHAUSTED": QuotaExceeded,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": AuthenticationError,
    "INVALID_ARGUMENT": InvalidReportError,
}


def error_class_for_status(name: str) -> type[LacClientError]:
    """The SDK class for a gRPC status ``name`` (e.g. "UNAVAILABLE"); ``NotRetryableError`` if unmapped. (A
    RESOURCE_EXHAUSTED without ``retry-after-seconds`` is not a quota: the SDK raises ``InvalidReportError``.)"""
    return _BY_STATUS.get(name, NotRetryableError)
