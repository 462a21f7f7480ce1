"""gRPC servicers (thin) and server factory for the curator.

Both services are registered from their generated descriptors with the roles each method
serves (``INGEST_ROLES``, ``QUERY_ROLES``); ``lac.common.rpc`` identifies the caller by its
mTLS certificate, checks the role and parses the request before a method runs; replies come
from ``lac.curator.service.serde``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from functools import partial

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.rpc import Caller, CertificateRoles, Role, service_handler
from lac.common.serde import deployment_to_proto
from lac.common.v1 import curator_pb2
from lac.common.version import server_version
from lac.curator.service import serde
from lac.curator.service.service import ARPA_CHUNK_CHARS, Curator
from lac.curator.store import export
from lac.curator.store.ingest import IngestBatch

INGEST = curator_pb2.DESCRIPTOR.services_by_name["CuratorIngest"]
QUERY = curator_pb2.DESCRIPTOR.services_by_name["Curator"]
SERVICE_NAMES = [INGEST.full_name, QUERY.full_name]

_READERS = {Role.ANALYST, Role.OPERATOR}
INGEST_ROLES = {"IngestBatch": {Role.INGEST}}
QUERY_ROLES = {
    "Release": _READERS,
    "PreviewRelease": _READERS,
    "ListReleases": _READERS,
    "GetRelease": _READERS,
    "TopNgrams": _READERS,
    "GetBudget": _READERS,
    "NgramProbabilities": _READERS,
    "NextWord": _READERS,
    "Perplexity": _READERS,
    "ExportArpa": _READERS,
    "GetDeployment": {Role.INGEST, Role.ANALYST, Role.OPERATOR},
    "GetStatus": {Role.OPERATOR},
    # reaches the handler for these roles; it serves only identities in export_identities (lac.curator.store.export)
    "ExportReports": {Role.ANALYST, Role.OPERATOR, Role.EXPORT},
}


class IngestServicer:
    """Batches from the shuffler."""

    def __init__(self, curator: Curator):
        self.curator = curator

    async def IngestBatch(self, batch: IngestBatch, context, caller: Caller):
        return await self.curator.ingest(batch)


class QueryServicer:
    """Releases and queries (analysts, operators) and the published deployment."""

    def __init__(self, curator: Curator):
        self.curator = curator

    async def Release(self, request, context, caller: Caller):
        spec, request_id = serde.release_spec(request), serde.request_id(request)
        return serde.record_message(
            await self.curator.release(spec, operator=serde.is_operator(caller), request_id=request_id), caller
        )

    async def PreviewRelease(self, request, context, caller: Caller):
        spec = serde.release_spec(request)
        return serde.preview_message(await self.curator.preview(spec, operator=serde.is_operator(caller)))

    async def ListReleases(self, request, context, caller: Caller):
        return curator_pb2.ListReleasesResponse(
            releases=[serde.record_message(r, caller) for r in await self.curator.list_releases()]
        )

    async def GetRelease(self, request, context, caller: Caller):
        record, items, log_probs, pseudo, _ = await self.curator.get_release(request.release_id)
        return curator_pb2.GetReleaseResponse(
            record=serde.record_message(record, caller),
            items=items,
            log_probs=log_probs.tolist(),
            pseudo_counts=[] if pseudo is None else pseudo.tolist(),
        )

    async def TopNgrams(self, request, context, caller: Caller):
        level = serde.top_level(request)
        top, described = await self.curator.top_ngrams(
            request.release_id, serde.top_k(request), request.order, request.exclude_special, level
        )
        return serde.top_message(top, level, described)

    async def GetBudget(self, request, context, caller: Caller):
        d = self.curator.deployment
        budget = self.curator.budget
        exports = await self.curator.exports()
        return curator_pb2.BudgetStatus(
            budget_epsilon=budget.epsilon,
            budget_delta=budget.delta,
            windows=serde.window_budgets(await self.curator.spent(), budget, serde.exports_per_window(exports)),
            window_seconds=d.window_seconds,
            reports_per_window=d.reports_per_window,
            exports=serde.export_records(exports, caller),
        )

    async def GetDeployment(self, request, context, caller: Caller):
        ring = self.curator.keyring  # its key ids, the current key first: the SDK seals to none other
        key_ids = (ring.current, *(k for k in ring.key_ids if k != ring.current)) if ring else ()
        d = dataclasses.replace(self.curator.deployment, key_ids=key_ids)
        return deployment_to_proto(d, server_version=server_version("curator"))

    async def GetStatus(self, request, context, caller: Caller):
        s = await self.curator.status()
        budget = self.curator.budget
        return curator_pb2.CuratorStatus(
            batches=s["batches"],
            reports=s["reports"],
            releases=s["releases"],
            rejects=s["rejects"],
            quarantined=s["quarantined"],
            budget_epsilon=budget.epsilon,
            budget_delta=budget.delta,
            replay_window_days=self.curator.config.replay_window_days,
            windows=serde.window_budgets(await self.curator.spent(), budget),
            reports_by_window=s["reports_by_window"],
        )

    async def NgramProbabilities(self, request, context, caller: Caller):
        found = await self.curator.ngram_probabilities(request.release_id, list(request.ngrams))
        return curator_pb2.NgramProbabilitiesResponse(
            ngrams=[curator_pb2.NgramProbability(ngram=g, probability=p) for g, p in found]
        )

    async def NextWord(self, request, context, caller: Caller):
        used, words = await self.curator.next_word(request.release_id, request.context, request.k)
        return curator_pb2.NextWordResponse(
            context_used=used, words=[curator_pb2.NgramProbability(ngram=w, probability=p) for w, p in words]
        )

    async def Perplexity(self, request, context, caller: Caller):
        ppl, n_sent, n_tok, oov = await self.curator.perplexity(request.release_id, request.text)
        return curator_pb2.PerplexityResponse(
            perplexity=ppl, n_sentences=n_sent, n_tokens=n_tok, n_out_of_vocabulary=oov
        )

    async def ExportArpa(self, request, context, caller: Caller):
        text = await self.curator.arpa(request.release_id)
        for i in range(0, len(text), ARPA_CHUNK_CHARS):
            yield curator_pb2.ArpaChunk(text=text[i : i + ARPA_CHUNK_CHARS])

    async def ExportReports(self, request, context, caller: Caller):
        first, last = serde.export_windows(request)
        export_id, guarantee, rows = await self.curator.export_reports(first, last, caller.identity, caller.roles)
        try:
            yield serde.export_header(export_id, guarantee)
            chunks = rows.chunks()
            while (data := await asyncio.to_thread(export.next_ipc, chunks)) is not None:
                yield curator_pb2.ExportChunk(arrow_ipc=data)
        finally:
            rows.close()


def create_server(curator: Curator) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``curator``, bound as its config says."""
    cfg = curator.config
    if not cfg.insecure and not cfg.tls_client_ca:
        raise ValueError(
            "the curator identifies callers by mutual TLS: set tls_cert, tls_key and "
            "tls_client_ca (`lac keys tls`), or insecure for a local demo"
        )
    auth = CertificateRoles(cfg.roles, insecure=cfg.insecure)
    server = common_server.new_server(cfg.max_message_bytes, cfg.max_concurrent_streams, cfg.max_connections)
    observe = curator.metrics.rpc  # latency per method and status code
    # A batch's bytes are scanned once: its reports cut out (counted as they are, refused above the limit) and
    # parsed only by the ingest workers.
    scan = {"IngestBatch": partial(serde.ingest_batch, max_reports=cfg.max_reports_per_batch)}
    server.add_generic_rpc_handlers(
        (
            service_handler(INGEST, IngestServicer(curator), INGEST_ROLES, auth, observe=observe, parsers=scan),
            service_handler(QUERY, QueryServicer(curator), QUERY_ROLES, auth, observe=observe),
        )
    )
    # Mutual TLS is required: a caller without a certificate signed by the client CA is refused at the
    # handshake, before any RPC (its client sees UNAVAILABLE).
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="curator")
    return common_server.finish_server(
        server, SERVICE_NAMES, cfg.host, cfg.port, server_tls, health_state=curator.health
    )
