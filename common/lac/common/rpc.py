"""The servicer boundary shared by the LAC services: who is calling, may they, and the status.

* Roles (client, ingest, analyst, operator, export) come from configuration: an mTLS certificate's
  common name or a bearer token maps to a ``Caller`` with a set of roles.
* ``service_handler`` registers every method of a generated service descriptor, with the roles
  each one serves (a method without a declared role is an error at start-up, so a new RPC in a
  .proto is never served by accident). Per call, in this order: identify the caller
  (UNAUTHENTICATED), check the role (PERMISSION_DENIED), only then receive the request (every method
  is registered with gRPC as request-streaming, so gRPC calls the handler before the request's bytes
  are received: a caller without the role never makes the server hold its message; optionally
  ``Receiving``: each request received within a timeout), run the method's ``before_parse`` check
  on the raw bytes if it has one (e.g. the shuffler's count of a Submit's reports: a message whose
  parsed form would be far larger than its bytes), parse the request (INVALID_ARGUMENT on malformed
  bytes: gRPC's own deserializer would answer UNKNOWN; or the method's own parser, e.g. the curator's
  scan of a batch), run the method.
* The one table mapping domain errors (``lac.common.errors``) to status codes; anything else is
  a bug: INTERNAL, logged once with the RPC name.
* Optionally (``observe``), each call's duration and final status code, for the service's metrics.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeAlias

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from lac.common import errors

log = logging.getLogger(__name__)

# A server-side call's context (grpc.aio.ServicerContext is generic in the stubs only, hence the string).
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

__all__ = [
    "Role",
    "Caller",
    "Authenticator",
    "CertificateRoles",
    "bearer_token",
    "parse_names",
    "service_handler",
    "STATUS",
    "ALL_ROLES",
    "count_field",
    "fields",
    "LENGTH_DELIMITED",
    "Receiving",
]


class Role(StrEnum):
    CLIENT = "client"  # submits reports (shuffler)
    INGEST = "ingest"  # delivers shuffled batches (curator; the shuffler's identity)
    ANALYST = "analyst"  # releases and queries DP outputs (curator)
    OPERATOR = "operator"  # runs the service: exact counts, quarantine, ledger, flush
    EXPORT = "export"  # reads privatized reports of closed windows (curator; off unless the operator grants it)


ALL_ROLES = frozenset(Role)

STATUS: dict[type[errors.LacError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
}


def status_of(exc: errors.LacError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return grpc.StatusCode.INTERNAL


@dataclass(frozen=True)
class Caller:
    """Who is calling: ``identity`` ("mtls:<common name>", "token:<client id>", None = anonymous)."""

    identity: str | None
    roles: frozenset[Role]


class Authenticator(Protocol):
    hint: str  # how to present credentials, for the UNAUTHENTICATED message

    def identify(self, context: Context) -> Caller:
        """The caller of this call (anonymous callers have identity None); ``errors.Unauthenticated``
        for credentials that are present but invalid."""


def parse_names(text: str) -> frozenset[str]:
    """Comma-separated names (certificate common names) as a set."""
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def peer_common_name(context: Context) -> str | None:
    """The common name of a verified mTLS client certificate, or None."""
    auth = context.auth_context() or {}
    names = list(auth.get("x509_common_name") or [])
    return names[0].decode() if names else None


class CertificateRoles:
    """Roles by mTLS certificate common name (``table``: role -> names). ``insecure``: no TLS, so
    no identities exist and every caller gets every role (local demos and tests only)."""

    hint = "connect with the mTLS client certificate of your role"

    def __init__(self, table: Mapping[Role, Iterable[str]], insecure: bool = False):
        self.table = {role: frozenset(names) for role, names in table.items()}
        self.insecure = insecure

    def roles_of(self, common_name: str) -> frozenset[Role]:
        return frozenset(r for r, names in self.table.items() if common_name in names)

    def identify(self, context: Context) -> Caller:
        if self.insecure:
            return Caller(None, ALL_ROLES)
        name = peer_common_name(context)
        if name is None:
            return Caller(None, frozenset())
        return Caller("mtls:" + name, self.roles_of(name))


_BEARER = re.compile(r"Bearer ([A-Za-z0-9._~+/-]+=*)")


def bearer_token(context: Context) -> str | None:
    """The token of exactly one well-formed ``authorization: Bearer <token>`` header.

    None when there is no such header; several headers or any other shape is Unauthenticated
    (no trimming, no guessing which of two headers was meant).
    """
    values = [v for k, v in (context.invocation_metadata() or ()) if k == "authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise errors.Unauthenticated("more than one authorization header")
    m = _BEARER.fullmatch(values[0]) if isinstance(values[0], str) else None
    if m is None:
        raise errors.Unauthenticated("malformed authorization header: expected exactly 'Bearer <token>'")
    return m.group(1)


MAX_DETAILS_CHARS = 2000  # of a status message (sent as metadata: at most 16 KiB by default)


async def _abort(context: Context, method: str, exc: errors.LacError) -> None:
    code = status_of(exc)
    trailing = []
    if exc.retry_after is not None:
        trailing.append(("retry-after-seconds", str(max(1, math.ceil(exc.retry_after)))))
    if exc.error_reason is not None:
        trailing.append((errors.ERROR_REASON_KEY, str(exc.error_reason)))
    if trailing:
        context.set_trailing_metadata(tuple(trailing))
    message = str(exc)
    if len(message) > MAX_DETAILS_CHARS:  # a message quoting a huge input: gRPC refuses over-long metadata
        message = message[:MAX_DETAILS_CHARS] + f"... ({len(message) - MAX_DETAILS_CHARS} more characters)"
    fields = {"method": method, "status_code": code.name}
    reason = getattr(exc, "reason", None) or exc.extra.get("reason")
    if reason is not None:
        fields["reject_reason"] = str(reason)
    log.info("%s: %s: %s", method, code.name, message, extra=fields)
    await context.abort(code, message)


async def _internal(context: Context, method: str) -> None:
    log.exception("internal error in %s", method, extra={"method": method, "status_code": "INTERNAL"})
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; the service log has the details")


def _parse(cls: type[Message], raw: bytes) -> Message:
    try:
        msg = cls.FromString(raw)
    except DecodeError:
        raise errors.InvalidArgument(f"malformed {cls.__name__} (not a valid protobuf message)") from None
    msg.DiscardUnknownFields()  # only known fields are acted on, stored or forwarded
    return msg


LENGTH_DELIMITED = 2
"""The protobuf wire type of bytes, strings and embedded messages."""


def fields(raw: bytes) -> Iterator[tuple[int, int, int, int]]:
    """The top-level fields of the serialized message ``raw`` in wire order, without parsing them:
    (field number, wire type, start, end) with ``raw[start:end]`` the value's bytes (a varint's bytes,
    8 or 4 fixed bytes, or a length-delimited field's contents). ValueError where the bytes are not
    a protobuf message (truncated, a varint over 10 bytes, a group or an unknown wire type)."""
    i, n = 0, len(raw)

    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while i < n and shift < 70:
            b = raw[i]
            i += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value, i
            shift += 7
        raise ValueError(f"malformed varint at byte {i}")

    while i < n:
        tag = raw[i]
        tag, i = (tag, i + 1) if tag < 0x80 else varint(i)  # one-byte tags and lengths inline: a batch has ~1M
        wire, number = tag & 7, tag >> 3
        if wire == LENGTH_DELIMITED:
            length, start = (raw[i], i + 1) if i < n and raw[i] < 0x80 else varint(i)
            i = start + length
        elif wire == 0:
            start = i
            _, i = varint(i)
        elif wire in (1, 5):
            start = i
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire} at byte {i}")
        if i > n or number == 0:
            raise ValueError(f"truncated field {number} (ends at byte {i} of {n})")
        yield number, wire, start, i


def count_field(raw: bytes, number: int, stop_after: int) -> int:
    """Entries of field ``number`` at the top level of the serialized message ``raw``, counted without
    parsing and at most ``stop_after + 1``. Malformed bytes end the count early (the parser rejects them)."""
    count = 0
    try:
        for got, wire, _, _ in fields(raw):
            if got == number and wire == LENGTH_DELIMITED:
                count += 1
                if count > stop_after:
                    break
    except ValueError:
        pass
    return count


class Receiving:
    """How a service receives an admitted caller's request: each message must have arrived within
    ``timeout_seconds`` of the call asking for it, else UNAVAILABLE with ``retry-after-seconds``
    naming ``setting``, so a slow sender holds a partial message for a bounded time."""

    def __init__(self, timeout_seconds: float, setting: str):
        if not timeout_seconds > 0:
            raise ValueError("Receiving needs timeout_seconds > 0")
        self.timeout_seconds, self.setting = timeout_seconds, setting

    async def next(self, requests: AsyncIterator[bytes]) -> bytes | None:
        """The next message of ``requests`` (None at the end of the stream), within the timeout."""
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await anext(aiter(requests), None)
        except TimeoutError:
            raise errors.Unavailable(
                f"the request was not received within {self.setting}={self.timeout_seconds:g} s "
                f"(a sender or network this slow holds the server's memory); retry",
                retry_after=1,
            ) from None


async def _next_message(requests: AsyncIterator[bytes], receiving: Receiving | None) -> bytes | None:
    return await (receiving.next(requests) if receiving is not None else anext(aiter(requests), None))


async def _one_message(requests: AsyncIterator[bytes], receiving: Receiving | None, method: str) -> bytes:
    """The request of a unary-request method, received once its caller has been admitted."""
    raw = await _next_message(requests, receiving)
    if raw is None:
        raise errors.InvalidArgument(f"no {method} request message was sent")
    return raw


def _serialize(response: Message | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def service_handler(
    service: ServiceDescriptor,
    impl: Any,
    roles: Mapping[str, Iterable[Role]],
    auth: Authenticator,
    on_malformed: Callable[[str], Awaitable[None]] | None = None,
    observe: Callable[[str, str, float], None] | None = None,
    before_parse: Mapping[str, Callable[[bytes], None]] | None = None,
    receiving: Receiving | None = None,
    parsers: Mapping[str, Callable[[bytes], Any]] | None = None,
) -> grpc.GenericRpcHandler:
    """A generic handler serving every method of ``service`` with ``impl.<Method>(request, context, caller)``.

    ``roles[method]`` are the roles allowed to call it. Unary methods return a message (or its
    serialized bytes); client-streaming methods receive an async iterator of parsed requests;
    server-streaming methods are async generators. ``on_malformed(method)`` is awaited when a
    request's bytes are not a valid message (e.g. to count it). ``observe(method, code, seconds)``
    is called when a call ends, with its gRPC status code name ("OK", "INVALID_ARGUMENT", ...).
    ``before_parse[method](raw)`` runs on each request's bytes of an admitted caller before they are
    parsed (it raises a ``LacError`` to refuse them). ``receiving`` bounds how requests are received.
    ``parsers[method](raw)`` replaces the parse of that method's requests (the method receives what it
    returns; it raises ``InvalidArgument`` for bytes that are not a valid request), e.g. to scan a large
    message once.
    """
    names = [m.name for m in service.methods]
    missing = [n for n in names if n not in roles or not hasattr(impl, n)]
    if missing or set(roles) - set(names):
        raise ValueError(
            f"{service.full_name}: every method needs an implementation and declared roles; "
            f"missing {missing}, unknown {sorted(set(roles) - set(names))}"
        )
    handlers = {}
    for m in service.methods:
        handlers[m.name] = _method_handler(
            f"/{service.full_name}/{m.name}",
            m,
            getattr(impl, m.name),
            frozenset(roles[m.name]),
            auth,
            on_malformed,
            (before_parse or {}).get(m.name),
            receiving,
            (parsers or {}).get(m.name),
        )
        if observe is not None:
            handlers[m.name] = _observed(m.name, handlers[m.name], observe)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


@asynccontextmanager
async def _boundary(context: Context, path: str) -> AsyncIterator[None]:
    """The one translation of a method's failure: a ``LacError`` aborts with its status, an abort
    already under way passes through, anything else is INTERNAL, logged once with the RPC name."""
    try:
        yield
    except errors.LacError as exc:
        await _abort(context, path, exc)
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception:
        await _internal(context, path)


def _method_handler(
    path: str,
    m: MethodDescriptor,
    fn: Callable[..., Any],
    allowed: frozenset[Role],
    auth: Authenticator,
    on_malformed: Callable[[str], Awaitable[None]] | None,
    before_parse: Callable[[bytes], None] | None = None,
    receiving: Receiving | None = None,
    parser: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    request_cls = GetMessageClass(m.input_type)

    async def parse(raw: bytes) -> Any:
        if before_parse is not None:
            before_parse(raw)
        try:
            return _parse(request_cls, raw) if parser is None else parser(raw)
        except errors.InvalidArgument:
            if on_malformed is not None:
                await on_malformed(m.name)
            raise

    def admit(context: Context) -> Caller:
        caller = auth.identify(context)
        if not caller.roles & allowed:
            if caller.identity is None:
                raise errors.Unauthenticated(f"missing credentials for {m.name}: {auth.hint}")
            who = f"role {', '.join(sorted(caller.roles))}" if caller.roles else "a caller with no role"
            raise errors.PermissionDenied(  # the role, never the identity: this message is logged
                f"{who} may not call {m.name} (allowed roles: {', '.join(sorted(allowed))})"
            )
        return caller

    if m.client_streaming and not m.server_streaming:

        async def stream_unary(request_iterator: AsyncIterator[bytes], context: Context) -> Any:
            async with _boundary(context, path):
                caller = admit(context)

                async def parsed() -> AsyncIterator[Any]:
                    while (raw := await _next_message(request_iterator, receiving)) is not None:
                        yield await parse(raw)

                return await fn(parsed(), context, caller)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, request_deserializer=None, response_serializer=_serialize
        )
    if m.server_streaming and not m.client_streaming:

        async def unary_stream(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async with _boundary(context, path):
                caller = admit(context)
                request = await parse(await _one_message(requests, receiving, m.name))
                agen = fn(request, context, caller)
                if not inspect.isasyncgen(agen):
                    raise TypeError(f"{path} must be an async generator")
                async for item in agen:
                    yield item

        return grpc.stream_stream_rpc_method_handler(  # request-streaming: see the module docstring
            unary_stream, request_deserializer=None, response_serializer=_serialize
        )
    if m.client_streaming:
        raise ValueError(f"{path}: bidirectional streaming is not used by LAC")

    async def unary_unary(requests: AsyncIterator[bytes], context: Context) -> Any:
        async with _boundary(context, path):
            caller = admit(context)
            return await fn(await parse(await _one_message(requests, receiving, m.name)), context, caller)

    # request-streaming at the gRPC level, so the caller is admitted before its request is received
    return grpc.stream_unary_rpc_method_handler(unary_unary, request_deserializer=None, response_serializer=_serialize)


def _status_name(context: Context, failed: BaseException | None) -> str:
    code = context.code()  # set by abort(); None when the method returned normally
    if code is not None:
        return code.name if isinstance(code, grpc.StatusCode) else str(code)
    if failed is None:
        return "OK"
    return "CANCELLED" if isinstance(failed, asyncio.CancelledError) else "UNKNOWN"


def _observed(
    method: str, handler: grpc.RpcMethodHandler[Any, Any], observe: Callable[[str, str, float], None]
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` reporting each call's duration and status code to ``observe``."""
    if handler.stream_stream is not None:
        inner_stream: Any = handler.stream_stream  # async here; grpc's stubs only know sync handlers

        async def unary_stream(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            start, failed = time.perf_counter(), None
            try:
                async for item in inner_stream(requests, context):
                    yield item
            except BaseException as exc:
                failed = exc
                raise
            finally:
                observe(method, _status_name(context, failed), time.perf_counter() - start)

        return grpc.stream_stream_rpc_method_handler(
            unary_stream, request_deserializer=None, response_serializer=handler.response_serializer
        )
    inner: Any = handler.stream_unary  # async, as above

    async def timed(request: Any, context: Context) -> Any:
        start, failed = time.perf_counter(), None
        try:
            return await inner(request, context)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            observe(method, _status_name(context, failed), time.perf_counter() - start)

    return grpc.stream_unary_rpc_method_handler(
        timed, request_deserializer=None, response_serializer=handler.response_serializer
    )
