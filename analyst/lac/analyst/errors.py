"""The analyst client's errors: ``AnalystError`` and its subclasses, chosen by a failed call's gRPC status code
and ``lac-error-reason`` trailing metadata, never by its message (``error_from_rpc``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from lac.common.errors import ERROR_REASON_KEY, ErrorReason, RemoteError

if TYPE_CHECKING:  # pragma: no cover
    pass


def _trailing(exc: grpc.RpcError, name: str) -> str | None:
    """The value of trailing metadata ``name`` of a failed call (None if absent)."""
    try:
        metadata: Any = exc.trailing_metadata() or ()  # (key, value) pairs
        return next((value for key, value in metadata if key == name), None)
    except (AttributeError, TypeError, ValueError):
        return None


def _retry_after(exc: grpc.RpcError) -> float:
    """The server's ``retry-after-seconds`` trailing metadata, 0 if none."""
    try:
        value = _trailing(exc, "retry-after-seconds")
        return 0.0 if value is None else max(0.0, min(float(value), 300.0))
    except (TypeError, ValueError):
        return 0.0


class AnalystError(RemoteError):
    """An error reported by the curator (or the transport to it).

    ``status`` is the gRPC status code (``grpc.StatusCode``; None when the transport gave none), ``code`` its
    name (e.g. ``"FAILED_PRECONDITION"``), ``details`` the curator's message, which quotes only public
    quantities (requests, configuration, budgets), and ``reason`` the machine-readable
    ``lac.common.errors.ErrorReason`` the curator sent with it, if any. The subclass is chosen by ``status``
    and ``reason`` only (``error_from_rpc``), never by the message text.
    """

    def __init__(
        self,
        code: str,
        details: str,
        *,
        status: grpc.StatusCode | None = None,
        reason: ErrorReason | None = None,
    ):
        super().__init__(code, details)
        self.status = status if status is not None else getattr(grpc.StatusCode, code, None)
        self.reason = reason


class PermissionDenied(AnalystError):
    """PERMISSION_DENIED or UNAUTHENTICATED: the certificate's identity lacks the role the call needs (or
    identifies no one)."""


class NotFound(AnalystError):
    """NOT_FOUND: an unknown release id."""


class InvalidArgument(AnalystError):
    """INVALID_ARGUMENT: a malformed or out-of-range request (unknown mechanism, bad ε or δ, bad n-gram
    order, unknown windows...)."""


class FailedPrecondition(AnalystError):
    """FAILED_PRECONDITION: the curator is not in a state that allows the request (no reports yet, open
    windows to export, data-dependent releases disabled...). Two kinds have their own subclass:
    ``BudgetExhausted`` and ``ReleaseRefused``."""


class BudgetExhausted(FailedPrecondition):
    """The release would overspend the privacy budget of an accounting window it covers (nothing was
    spent); ``details`` names the windows, what they spent and what remains."""


class ReleaseRefused(FailedPrecondition):
    """The accuracy check predicted that the release's noise would swamp the signal; ``details`` says
    what would help. Retry with ``force=True`` to release anyway (see ``CuratorClient.preview``)."""


class ResourceExhausted(AnalystError):
    """RESOURCE_EXHAUSTED: a limit of the curator is reached (e.g. too many concurrent calls, a message too
    large); retry later or ask for less."""


class Unavailable(AnalystError):
    """UNAVAILABLE or DEADLINE_EXCEEDED: the curator is unreachable (down, wrong address, or the TLS
    handshake was refused) or did not answer in time; retry later."""


class ChannelNotReady(Unavailable):
    """The release needs the curator's local channel, which it is still sampling (once per deployment):
    ``details`` says how far it is and the time left, ``retry_after`` the seconds to wait (nothing was spent).
    ``release`` raises it only after waiting ``CHANNEL_WAIT`` seconds in all."""

    retry_after: float | None = None


_BY_CODE: dict[grpc.StatusCode, type[AnalystError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}
_BY_REASON: dict[ErrorReason, type[AnalystError]] = {
    ErrorReason.BUDGET_EXHAUSTED: BudgetExhausted,
    ErrorReason.RELEASE_REFUSED: ReleaseRefused,
    ErrorReason.CHANNEL_NOT_READY: ChannelNotReady,
}


def _error_reason(exc: grpc.RpcError) -> ErrorReason | None:
    """The ``lac-error-reason`` trailing metadata of a failed call (None if absent or unknown to this client)."""
    value = _trailing(exc, ERROR_REASON_KEY)
    try:
        return None if value is None else ErrorReason(value)
    except ValueError:
        return None


def error_from_rpc(exc: grpc.RpcError) -> AnalystError:
    """The ``AnalystError`` for a failed RPC: its class from the status code and the ``lac-error-reason``
    trailing metadata (``lac.common.errors.ErrorReason``), never from the message."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    details = details or str(exc)
    if not isinstance(code, grpc.StatusCode):
        return AnalystError("UNKNOWN", details)
    reason = _error_reason(exc)
    cls = _BY_CODE.get(code, AnalystError)
    if reason is not None and issubclass(_BY_REASON.get(reason, AnalystError), cls):
        cls = _BY_REASON[reason]
    error = cls(code.name, details, status=code, reason=reason)
    if isinstance(error, ChannelNotReady):
        error.retry_after = _retry_after(exc) or None
    return error
