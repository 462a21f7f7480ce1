"""How the analyst client sends a release: request ids and retries of the same request (``release_with_retries``),
waiting the curator's ``retry-after-seconds`` and its local channel."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from lac.analyst.errors import _error_reason, _retry_after
from lac.common import retry
from lac.common.errors import ErrorReason
from lac.common.v1 import curator_pb2

if TYPE_CHECKING:  # pragma: no cover
    pass


log = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 4  # a release is sent at most this often (same request id) after UNAVAILABLE or a deadline
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
RELEASE_BACKOFF = retry.Backoff(initial=1.0, maximum=300.0)  # waits up to 1, 2, 4... s; a retry-after up to 300 s
CHANNEL_WAIT = 1800.0  # a release waits at most this long in all for the curator's local channel (sampled once)


def _retryable(exc: BaseException) -> bool:
    """Whether a Release attempt's failure is worth another attempt (UNAVAILABLE, DEADLINE_EXCEEDED)."""
    return isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)) and exc.code() in _RETRYABLE


def new_request_id() -> str:
    """A fresh release request id (random, 32 hex digits)."""
    return uuid.uuid4().hex


def release_with_retries(
    call: Callable,
    request: curator_pb2.ReleaseRequest,
    timeout: float,
    attempts: int = RELEASE_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    channel_wait: float = CHANNEL_WAIT,
):
    """``call(request, timeout=timeout)`` (a ``Release`` stub method), sent again with the same request id
    after UNAVAILABLE or DEADLINE_EXCEEDED, waiting the server's ``retry-after-seconds`` at least, else up to
    1, 2, 4... s (``lac.common.retry``: full jitter): the curator returns the release an earlier attempt
    made (spent once), awaits one still running, or makes it. While the curator samples its local channel
    (``ErrorReason.CHANNEL_NOT_READY``) it waits each retry-after it is told, logging a warning with the
    progress first, up to ``channel_wait`` seconds in all (those waits do not count as attempts). Other
    errors, and the last attempt's, are raised (``grpc.RpcError``)."""
    if not request.request_id:
        raise ValueError("release_with_retries needs a request with a request_id (new_request_id())")
    waited, failed = 0.0, 0
    while True:
        try:
            return call(request, timeout=timeout)
        except grpc.RpcError as exc:
            seconds = _retry_after(exc)
            if _error_reason(exc) is ErrorReason.CHANNEL_NOT_READY:
                if waited + seconds > channel_wait:
                    raise
                log.warning("%s; asking again in %.0f s", exc.details(), seconds)
                waited += seconds
                sleep(seconds)
                continue
            failed += 1
            if failed >= attempts or not _retryable(exc):
                raise
            sleep(RELEASE_BACKOFF.delay(failed, seconds))
