"""gRPC servicer (thin) and server factory for the shuffler.

Every method of ``lac.v1.Shuffler`` is registered from the generated descriptor with the roles
it serves (``ROLES``); ``lac.common.rpc`` identifies the caller, checks the role and parses
the request before a method runs.
"""

from __future__ import annotations

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.rpc import Caller, Role, service_handler
from lac.common.v1 import shuffler_pb2
from lac.shuffler.service import Shuffler

SERVICE = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"]
SERVICE_NAME = SERVICE.full_name

ROLES = {
    "Submit": {Role.CLIENT},
    "SubmitStream": {Role.CLIENT},
    "GetDeployment": {Role.CLIENT, Role.OPERATOR},
    "GetStatus": {Role.OPERATOR},
    "Flush": {Role.OPERATOR},
}

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


class ShufflerServicer:
    def __init__(self, shuffler: Shuffler):
        self.shuffler = shuffler

    async def Submit(self, request, context, caller: Caller):
        return _acks(request.reports, await self.shuffler.submit(request.reports, caller.identity))

    async def SubmitStream(self, requests, context, caller: Caller):
        acks = []
        async for request in requests:
            acks.append(_acks(request.reports, await self.shuffler.submit(request.reports, caller.identity)))
        return b"".join(acks)

    async def GetDeployment(self, request, context, caller: Caller):
        return self.shuffler.deployment_message()

    async def GetStatus(self, request, context, caller: Caller):
        return await self.shuffler.status()

    async def Flush(self, request, context, caller: Caller):
        released = await self.shuffler.flush()
        if released is None:
            return shuffler_pb2.FlushResponse(released=False, note=self.shuffler.note)
        return shuffler_pb2.FlushResponse(released=True, batch_id=released[0], batch_size=released[1],
                                          note=self.shuffler.note)


def create_server(shuffler: Shuffler) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``shuffler``, bound as its config says."""
    server = common_server.new_server()
    async def count_malformed(method: str) -> None:
        await shuffler.count_reject("malformed")

    server.add_generic_rpc_handlers((service_handler(SERVICE, ShufflerServicer(shuffler), ROLES, shuffler.auth,
                                                     on_malformed=count_malformed),))
    cfg = shuffler.config
    # With a client CA every caller must present a certificate (gRPC cannot ask for an optional one);
    # without, callers are identified by bearer tokens only.
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="shuffler")
    return common_server.finish_server(server, [SERVICE_NAME], cfg.host, cfg.port, server_tls)
