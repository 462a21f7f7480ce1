"""Domain errors and the one table that maps them to gRPC status codes."""

from __future__ import annotations

import functools
import logging

import grpc

log = logging.getLogger(__name__)


class LacError(Exception):
    """Base of errors a service reports to its caller with a precise status."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(LacError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LacError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(LacError):
    code = grpc.StatusCode.ALREADY_EXISTS


class Unauthenticated(LacError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LacError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LacError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(LacError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(LacError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(LacError):
    code = grpc.StatusCode.DATA_LOSS


def rpc(method):
    """Decorate an async servicer method: domain errors become their gRPC status."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except LacError as exc:
            await context.abort(exc.code, str(exc))
        except ValueError as exc:  # parameter validation in library code
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    return wrapper
