"""The SDK's errors as ``ShufflerClient`` raises them: each class is its ``lac.client.errors``
class and also a ``grpc.RpcError``, so code that caught raw gRPC errors keeps working while new
code catches the SDK's tree. Kept apart so that ``lac.client.errors`` needs no grpc."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import grpc

from lac.client import errors

RETRY_AFTER_KEY = "retry-after-seconds"


class RetryableError(errors.RetryableError, grpc.RpcError):
    """``lac.client.errors.RetryableError`` from an RPC."""


class QuotaExceeded(errors.QuotaExceeded, grpc.RpcError):
    """``lac.client.errors.QuotaExceeded`` from an RPC."""


class NotRetryableError(errors.NotRetryableError, grpc.RpcError):
    """``lac.client.errors.NotRetryableError`` from an RPC."""


class AuthenticationError(errors.AuthenticationError, grpc.RpcError):
    """``lac.client.errors.AuthenticationError`` from an RPC."""


class InvalidReportError(errors.InvalidReportError, grpc.RpcError):
    """``lac.client.errors.InvalidReportError`` from an RPC."""


_FLAVOUR: dict[type[errors.LacClientError], type[errors.LacClientError]] = {
    c.__mro__[1]: c for c in (RetryableError, QuotaExceeded, NotRetryableError, AuthenticationError, InvalidReportError)
}


def retry_after(trailing: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The ``retry-after-seconds`` value of trailing metadata, if present and valid."""
    for key, value in trailing or ():
        if key == RETRY_AFTER_KEY:
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                return None
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


def trailing_of(exc: grpc.RpcError) -> errors.Metadata:
    """The (key, value) pairs of ``exc``'s trailing metadata (empty for an error without any)."""
    raw: tuple[Any, ...] = exc.trailing_metadata() or () if callable(getattr(exc, "trailing_metadata", None)) else ()
    return tuple(raw)  # (key, value) namedtuples, whatever grpc's stubs call them


def wrap(exc: grpc.RpcError, what: str) -> errors.LacClientError:
    """The SDK error for ``exc`` (raised by the RPC ``what``), keeping its status code, details and
    trailing metadata."""
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if callable(getattr(exc, "details", None)) else None) or str(exc)
    trailing = trailing_of(exc)
    base = errors.error_class_for_status(code.name)
    if base is errors.QuotaExceeded and retry_after(trailing) is None:
        # a refusal with no time to wait for is not a quota: the request itself is over a limit (its size)
        base = errors.InvalidReportError
    cls = _FLAVOUR[base]
    kwargs: dict[str, Any] = dict(status_code=code, status_details=details, trailing=trailing)
    hint = ""
    if issubclass(cls, errors.RetryableError):
        kwargs["retry_after"] = wait = retry_after(trailing)
        if wait is not None:
            hint = f" (retry after {wait:g} s)"
    elif base is errors.AuthenticationError:
        hint = " (check the client's bearer token: ShufflerClient(token=...) or $LAC_CLIENT_TOKEN)"
    return cls(f"{what} failed: {code.name}: {details}{hint}", **kwargs)
