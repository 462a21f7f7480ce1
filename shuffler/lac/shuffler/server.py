"""gRPC servicer (thin) and server factory for the shuffler."""

from __future__ import annotations

import math

import grpc
from google.protobuf.message import DecodeError

from lac.common import server as common_server
from lac.common import tls
from lac.common.errors import InvalidArgument, rpc
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.service import QuotaExceeded, Shuffler

SERVICE_NAME = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].full_name


_ACK_STATUS = {True: bytes((0x10, shuffler_pb2.ACK_STATUS_STORED)),  # ReportAck.status = 2 (varint)
               False: bytes((0x10, shuffler_pb2.ACK_STATUS_DUPLICATE))}


def _acks(reports, stored) -> bytes:
    """The serialized SubmitResponse, built directly: building one ReportAck object per report
    cost more than the report's share of the durable commit. Same bytes as
    ``SubmitResponse(acks=[ReportAck(idempotency_id=..., status=...)]).SerializeToString()``."""
    out = []
    for r, s in zip(reports, stored):
        idem = r.idempotency_id  # 8..64 bytes (validated), so both lengths fit one varint byte
        out.append(b"\x0a" + bytes((len(idem) + 4, 0x0a, len(idem))) + idem + _ACK_STATUS[s])
    return b"".join(out)


class ShufflerServicer(shuffler_pb2_grpc.ShufflerServicer):
    def __init__(self, shuffler: Shuffler):
        self.shuffler = shuffler

    async def _submit(self, raw: bytes, client, context):
        try:
            request = shuffler_pb2.SubmitRequest.FromString(raw)
        except DecodeError:
            await self.shuffler.count_reject("malformed")
            raise InvalidArgument("malformed SubmitRequest (not a valid protobuf message)") from None
        request.DiscardUnknownFields()  # only known payload fields are stored and forwarded
        try:
            return _acks(request.reports, await self.shuffler.submit(request.reports, client))
        except QuotaExceeded as exc:
            context.set_trailing_metadata((("retry-after-seconds", str(max(1, math.ceil(exc.retry_after)))),))
            raise

    @rpc
    async def Submit(self, request, context):
        return await self._submit(request, self.shuffler.auth.identify(context), context)

    @rpc
    async def SubmitStream(self, request_iterator, context):
        client = self.shuffler.auth.identify(context)
        acks = []
        async for request in request_iterator:
            acks.append(await self._submit(request, client, context))
        return b"".join(acks)

    @rpc
    async def GetStatus(self, request, context):
        return await self.shuffler.status()

    @rpc
    async def Flush(self, request, context):
        released = await self.shuffler.flush()
        if released is None:
            return shuffler_pb2.FlushResponse(released=False, note=self.shuffler.note)
        return shuffler_pb2.FlushResponse(released=True, batch_id=released[0], batch_size=released[1],
                                          note=self.shuffler.note)


def create_server(shuffler: Shuffler) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``shuffler``, bound as its config says.

    Submit and SubmitStream take raw bytes and parse them in the servicer, so a malformed
    message is INVALID_ARGUMENT (gRPC's own deserializer would answer UNKNOWN).
    """
    server = common_server.new_server()
    s = ShufflerServicer(shuffler)
    out = None  # Submit/SubmitStream return serialized SubmitResponse bytes (see _acks)
    handlers = {
        "Submit": grpc.unary_unary_rpc_method_handler(s.Submit, request_deserializer=None, response_serializer=out),
        "SubmitStream": grpc.stream_unary_rpc_method_handler(s.SubmitStream, request_deserializer=None,
                                                             response_serializer=out),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            s.GetStatus, request_deserializer=shuffler_pb2.ShufflerStatusRequest.FromString,
            response_serializer=shuffler_pb2.ShufflerStatus.SerializeToString),
        "Flush": grpc.unary_unary_rpc_method_handler(
            s.Flush, request_deserializer=shuffler_pb2.FlushRequest.FromString,
            response_serializer=shuffler_pb2.FlushResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    cfg = shuffler.config
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="shuffler",
                                client_cert_optional=True)
    return common_server.finish_server(server, [SERVICE_NAME], cfg.host, cfg.port, server_tls)
