"""gRPC servicer (thin) and server factory for the shuffler."""

from __future__ import annotations

import grpc

from lac.common import server as common_server
from lac.common.errors import rpc
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.service import Shuffler

SERVICE_NAME = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].full_name


def _acks(reports, stored) -> shuffler_pb2.SubmitResponse:
    return shuffler_pb2.SubmitResponse(acks=[
        shuffler_pb2.ReportAck(idempotency_id=r.idempotency_id,
                               status=shuffler_pb2.ACK_STATUS_STORED if s else shuffler_pb2.ACK_STATUS_DUPLICATE)
        for r, s in zip(reports, stored)])


class ShufflerServicer(shuffler_pb2_grpc.ShufflerServicer):
    def __init__(self, shuffler: Shuffler):
        self.shuffler = shuffler

    @rpc
    async def Submit(self, request, context):
        return _acks(request.reports, await self.shuffler.submit(request.reports))

    @rpc
    async def SubmitStream(self, request_iterator, context):
        acks = shuffler_pb2.SubmitResponse()
        async for request in request_iterator:
            acks.acks.extend(_acks(request.reports, await self.shuffler.submit(request.reports)).acks)
        return acks

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
    """Build (not start) the gRPC server for ``shuffler``, bound as its config says."""
    server = common_server.new_server()
    shuffler_pb2_grpc.add_ShufflerServicer_to_server(ShufflerServicer(shuffler), server)
    return common_server.finish_server(server, [SERVICE_NAME], shuffler.config.host, shuffler.config.port)
