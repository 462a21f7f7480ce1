"""gRPC servicers (thin) and server factory for the curator."""

from __future__ import annotations

import grpc

from lac.common import server as common_server
from lac.common.errors import rpc
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.service import Curator

SERVICE_NAMES = [curator_pb2.DESCRIPTOR.services_by_name[n].full_name for n in ("CuratorIngest", "Curator")]


class IngestServicer(curator_pb2_grpc.CuratorIngestServicer):
    def __init__(self, curator: Curator):
        self.curator = curator

    @rpc
    async def IngestBatch(self, request, context):
        return await self.curator.ingest(request)


class QueryServicer(curator_pb2_grpc.CuratorServicer):
    def __init__(self, curator: Curator):
        self.curator = curator

    @rpc
    async def Release(self, request, context):
        return await self.curator.release(request)

    @rpc
    async def ListReleases(self, request, context):
        return curator_pb2.ListReleasesResponse(releases=await self.curator.list_releases())

    @rpc
    async def GetRelease(self, request, context):
        record, log_probs, mean = await self.curator.get_release(request.release_id)
        reply = curator_pb2.GetReleaseResponse(record=record, items=self.curator.vocab.items,
                                               log_probs=log_probs.tolist())
        if request.include_pre_noise_mean:
            reply.pre_noise_mean.extend(mean.tolist())
        return reply

    @rpc
    async def TopNgrams(self, request, context):
        top = await self.curator.top_ngrams(request.release_id, request.k, request.order)
        return curator_pb2.TopNgramsResponse(
            ngrams=[curator_pb2.NgramProbability(ngram=g, probability=p) for g, p in top])

    @rpc
    async def GetStatus(self, request, context):
        return await self.curator.status()


def create_server(curator: Curator) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``curator``, bound as its config says."""
    server = common_server.new_server()
    curator_pb2_grpc.add_CuratorIngestServicer_to_server(IngestServicer(curator), server)
    curator_pb2_grpc.add_CuratorServicer_to_server(QueryServicer(curator), server)
    return common_server.finish_server(server, SERVICE_NAMES, curator.config.host, curator.config.port)
