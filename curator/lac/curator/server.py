"""gRPC servicers (thin) and server factory for the curator."""

from __future__ import annotations

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.errors import LacError, PermissionDenied, rpc
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.service import ARPA_CHUNK_CHARS, Curator

SERVICE_NAMES = [curator_pb2.DESCRIPTOR.services_by_name[n].full_name for n in ("CuratorIngest", "Curator")]


class IngestServicer(curator_pb2_grpc.CuratorIngestServicer):
    """Batches from the shuffler; with mTLS only the configured identities may deliver them."""

    def __init__(self, curator: Curator):
        self.curator = curator
        cfg = curator.config
        self.allowed = None if cfg.insecure else {n.strip() for n in cfg.ingest_identities.split(",") if n.strip()}

    @rpc
    async def IngestBatch(self, request, context):
        if self.allowed is not None:
            who = tls.peer_identity(context)
            if who not in self.allowed:
                raise PermissionDenied(f"client certificate {who!r} may not ingest batches "
                                       f"(allowed: {', '.join(sorted(self.allowed))})")
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
        record, items, log_probs, mean = await self.curator.get_release(request.release_id)
        reply = curator_pb2.GetReleaseResponse(record=record, items=items, log_probs=log_probs.tolist())
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

    @rpc
    async def NgramProbabilities(self, request, context):
        found = await self.curator.ngram_probabilities(request.release_id, list(request.ngrams))
        return curator_pb2.NgramProbabilitiesResponse(
            ngrams=[curator_pb2.NgramProbability(ngram=g, probability=p) for g, p in found])

    @rpc
    async def NextWord(self, request, context):
        used, words = await self.curator.next_word(request.release_id, request.context, request.k)
        return curator_pb2.NextWordResponse(
            context_used=used, words=[curator_pb2.NgramProbability(ngram=w, probability=p) for w, p in words])

    @rpc
    async def Perplexity(self, request, context):
        ppl, n_sent, n_tok, oov = await self.curator.perplexity(request.release_id, request.text)
        return curator_pb2.PerplexityResponse(perplexity=ppl, n_sentences=n_sent, n_tokens=n_tok,
                                              n_out_of_vocabulary=oov)

    async def ExportArpa(self, request, context):
        try:
            text = await self.curator.arpa(request.release_id)
        except LacError as exc:
            await context.abort(exc.code, str(exc))
        for i in range(0, len(text), ARPA_CHUNK_CHARS):
            yield curator_pb2.ArpaChunk(text=text[i:i + ARPA_CHUNK_CHARS])


def create_server(curator: Curator) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``curator``, bound as its config says."""
    server = common_server.new_server()
    curator_pb2_grpc.add_CuratorIngestServicer_to_server(IngestServicer(curator), server)
    curator_pb2_grpc.add_CuratorServicer_to_server(QueryServicer(curator), server)
    cfg = curator.config
    if not cfg.insecure and not cfg.tls_client_ca:
        raise ValueError("the curator serves mutual TLS: set tls_cert, tls_key and tls_client_ca "
                         "(`lac keys tls`), or insecure for a local demo")
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="curator")
    return common_server.finish_server(server, SERVICE_NAMES, cfg.host, cfg.port, server_tls)
