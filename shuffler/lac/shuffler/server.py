"""gRPC servicer (thin) and server factory for the shuffler.

Every method of ``lac.v1.Shuffler`` is registered from the generated descriptor with the roles
it serves (``ROLES``); ``lac.common.rpc`` identifies the caller, checks the role and parses
the request before a method runs.
"""

from __future__ import annotations

import logging

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.errors import InvalidArgument, LacError, RejectReason
from lac.common.rpc import Caller, Role, service_handler
from lac.common.v1 import shuffler_pb2
from lac.shuffler import wire
from lac.shuffler.service import SERVICE_NAME, Shuffler, WrongShard
from lac.shuffler.shards import SHARD_METADATA_KEY

log = logging.getLogger(__name__)

SERVICE = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"]
SCAN_ABOVE_BYTES = 64 * 1024  # Submit messages larger than this have their reports counted before parsing

ROLES = {
    "Submit": {Role.CLIENT},
    "SubmitStream": {Role.CLIENT},
    "GetDeployment": {Role.CLIENT, Role.OPERATOR},
    "GetStatus": {Role.OPERATOR},
    "Flush": {Role.OPERATOR},
    "GetShards": {Role.CLIENT, Role.OPERATOR},
}


class _BoundedReports(grpc.GenericRpcHandler):
    """Refuses, before it is parsed, a Submit (or SubmitStream) message of a client holding more reports
    than ``max_reports_per_request``: parsed, an empty report costs ~70 bytes of memory for its 2 bytes on
    the wire, so a 64 MiB message of them would take gigabytes. Callers without the client role pass
    through unscanned and are refused before parsing by ``lac.common.rpc``."""

    def __init__(self, inner: grpc.GenericRpcHandler, shuffler: Shuffler):
        self.inner, self.shuffler = inner, shuffler
        self.limit = shuffler.config.max_reports_per_request

    def _too_many(self, raw: bytes) -> str | None:
        if len(raw) <= SCAN_ABOVE_BYTES or wire.count_reports(raw, self.limit) <= self.limit:
            return None
        self.shuffler._log.count_reject(RejectReason.INVALID_ARGUMENT)
        return f"more than {self.limit} reports in one request (max_reports_per_request)"

    def _is_client(self, context) -> bool:
        try:
            return Role.CLIENT in self.shuffler.auth.identify(context).roles
        except LacError:
            return False

    def service(self, details):
        handler = self.inner.service(details)
        if handler is None or details.method not in (f"/{SERVICE_NAME}/Submit", f"/{SERVICE_NAME}/SubmitStream"):
            return handler
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(raw: bytes, context):
                if len(raw) > SCAN_ABOVE_BYTES and self._is_client(context):
                    problem = self._too_many(raw)
                    if problem:
                        log.info("%s: INVALID_ARGUMENT: %s", details.method, problem)
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                return await inner(raw, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=None, response_serializer=handler.response_serializer
            )
        inner_stream = handler.stream_unary

        async def stream(request_iterator, context):
            async def bounded():  # iterated only once lac.common.rpc has admitted the caller
                async for raw in request_iterator:
                    problem = self._too_many(raw)
                    if problem:
                        raise InvalidArgument(problem)  # answered by lac.common.rpc like any domain error
                    yield raw

            return await inner_stream(bounded(), context)

        return grpc.stream_unary_rpc_method_handler(
            stream, request_deserializer=None, response_serializer=handler.response_serializer
        )


def _name_the_right_shard(context, refusal: WrongShard) -> None:
    """Put the right replica's address in the trailing metadata of a wrong-shard refusal (``lac-shard``), so
    the SDK can follow it without parsing the message; ``lac.common.rpc`` then answers FAILED_PRECONDITION."""
    context.set_trailing_metadata(((SHARD_METADATA_KEY, refusal.shard),))


class ShufflerServicer:
    """The ``lac.v1.Shuffler`` methods (roles in ``ROLES``); the work is in ``Shuffler``."""

    def __init__(self, shuffler: Shuffler):
        self.shuffler = shuffler

    async def Submit(self, request, context, caller: Caller):
        try:
            stored = await self.shuffler.submit(request.reports, caller.identity)
            return wire.submit_response((r.idempotency_id for r in request.reports), stored)
        except WrongShard as exc:
            _name_the_right_shard(context, exc)
            raise

    async def SubmitStream(self, requests, context, caller: Caller):
        acks, total, limit = [], 0, self.shuffler.config.max_reports_per_request
        async for request in requests:
            total += len(request.reports)
            if total > limit:  # the one response carries an ack per report: bound the whole call
                await self.shuffler.count_reject(RejectReason.INVALID_ARGUMENT, len(request.reports))
                raise InvalidArgument(
                    f"more than {limit} reports in one SubmitStream call (max_reports_per_request); "
                    f"the earlier messages' reports may be stored: resend them in a new call "
                    f"with the same idempotency ids"
                )
            try:
                stored = await self.shuffler.submit(request.reports, caller.identity)
            except WrongShard as exc:  # raised by the first message, before anything is stored
                _name_the_right_shard(context, exc)
                raise
            acks.append(wire.submit_response((r.idempotency_id for r in request.reports), stored))
        return b"".join(acks)

    async def GetDeployment(self, request, context, caller: Caller):
        return self.shuffler.deployment_message()

    async def GetStatus(self, request, context, caller: Caller):
        return await self.shuffler.status()

    async def Flush(self, request, context, caller: Caller):
        released = await self.shuffler.flush()
        if released is None:
            return shuffler_pb2.FlushResponse(released=False, note=self.shuffler.note)
        return shuffler_pb2.FlushResponse(
            released=True, batch_id=released[0], batch_size=released[1], note=self.shuffler.note
        )

    async def GetShards(self, request, context, caller: Caller):
        return self.shuffler.shard_assignment(caller.identity)


def create_server(shuffler: Shuffler) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``shuffler``, bound as its config says."""
    cfg = shuffler.config
    server = common_server.new_server(cfg.max_message_bytes, cfg.max_concurrent_streams)

    async def count_malformed(method: str) -> None:
        await shuffler.count_reject(RejectReason.MALFORMED)

    handler = service_handler(
        SERVICE,
        ShufflerServicer(shuffler),
        ROLES,
        shuffler.auth,
        on_malformed=count_malformed,
        observe=shuffler.metrics.rpc,
    )
    server.add_generic_rpc_handlers((_BoundedReports(handler, shuffler),))
    # With a client CA every caller must present a certificate (gRPC cannot ask for an optional one);
    # without, callers are identified by bearer tokens only.
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="shuffler")
    return common_server.finish_server(
        server, [SERVICE_NAME], cfg.host, cfg.port, server_tls, health_state=shuffler.health
    )
