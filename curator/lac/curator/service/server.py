"""gRPC servicers and the server factory for the curator: each method parses its request with
``lac.curator.service.serde``, calls one handler (``lac.curator.service.handlers``) over the curator's state
(``lac.curator.service.state``) and replies with ``serde``.

Both services are registered from their generated descriptors with the roles each method
serves (``INGEST_ROLES``, ``QUERY_ROLES``); ``lac.common.rpc`` identifies the caller by its
mTLS certificate, checks the role and parses the request before a method runs.
"""

from __future__ import annotations

from functools import partial

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.rpc import Caller, CertificateRoles, Role, service_handler
from lac.common.v1 import curator_pb2
from lac.curator.ingest.chunks import IngestBatch
from lac.curator.service import serde
from lac.curator.service.handlers import exports, ingest, query, release, status
from lac.curator.service.state import CuratorState

INGEST = curator_pb2.DESCRIPTOR.services_by_name["CuratorIngest"]
QUERY = curator_pb2.DESCRIPTOR.services_by_name["Curator"]

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

    def __init__(self, state: CuratorState):
        self.state = state

    async def IngestBatch(self, batch: IngestBatch, context, caller: Caller):
        return serde.ingest_message(await ingest.ingest(self.state, batch))


class QueryServicer:
    """Releases and queries (analysts, operators) and the published deployment."""

    def __init__(self, state: CuratorState):
        self.state = state

    async def Release(self, request, context, caller: Caller):
        spec, request_id = serde.release_spec(request), serde.request_id(request)
        record = await release.release(self.state, spec, operator=serde.is_operator(caller), request_id=request_id)
        return serde.record_message(record, caller)

    async def PreviewRelease(self, request, context, caller: Caller):
        spec = serde.release_spec(request)
        return serde.preview_message(await release.preview(self.state, spec, operator=serde.is_operator(caller)))

    async def ListReleases(self, request, context, caller: Caller):
        return serde.releases_message(await release.list_releases(self.state), caller)

    async def GetRelease(self, request, context, caller: Caller):
        return serde.release_message(await release.get_release(self.state, request.release_id), caller)

    async def TopNgrams(self, request, context, caller: Caller):
        k, level = serde.top_k(request), serde.top_level(request)
        top = await query.top_ngrams(self.state, request.release_id, k, request.order, request.exclude_special, level)
        return serde.top_message(top)

    async def GetBudget(self, request, context, caller: Caller):
        return serde.budget_message(await status.budget(self.state), caller)

    async def GetDeployment(self, request, context, caller: Caller):
        return serde.deployment_message(status.deployment(self.state))

    async def GetStatus(self, request, context, caller: Caller):
        return serde.status_message(await status.status(self.state))

    async def NgramProbabilities(self, request, context, caller: Caller):
        found = await query.ngram_probabilities(self.state, request.release_id, list(request.ngrams))
        return serde.probabilities_message(found)

    async def NextWord(self, request, context, caller: Caller):
        return serde.next_word_message(
            await query.next_word(self.state, request.release_id, request.context, request.k)
        )

    async def Perplexity(self, request, context, caller: Caller):
        return serde.perplexity_message(await query.perplexity(self.state, request.release_id, request.text))

    async def ExportArpa(self, request, context, caller: Caller):
        for message in serde.arpa_messages(await query.arpa(self.state, request.release_id)):
            yield message

    async def ExportReports(self, request, context, caller: Caller):
        first, last = serde.export_windows(request)
        made = await exports.export_reports(self.state, first, last, caller.identity, caller.roles)
        try:
            async for message in serde.export_messages(made, exports.chunks(made)):
                yield message
        finally:
            made.rows.close()


def create_server(state: CuratorState) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for the curator of ``state``, bound as its config says."""
    cfg = state.config
    if not cfg.insecure and not cfg.tls_client_ca:
        raise ValueError(
            "the curator identifies callers by mutual TLS: set tls_cert, tls_key and "
            "tls_client_ca (`lac keys tls`), or insecure for a local demo"
        )
    auth = CertificateRoles(cfg.roles, insecure=cfg.insecure)
    server = common_server.new_server(cfg.max_message_bytes, cfg.max_concurrent_streams, cfg.max_connections)
    observe = state.metrics.rpc  # latency per method and status code
    # A batch's bytes are scanned once: its reports cut out (counted as they are, refused above the limit) and
    # parsed only by the ingest workers.
    scan = {"IngestBatch": partial(serde.ingest_batch, max_reports=cfg.max_reports_per_batch)}
    server.add_generic_rpc_handlers(
        (
            service_handler(INGEST, IngestServicer(state), INGEST_ROLES, auth, observe=observe, parsers=scan),
            service_handler(QUERY, QueryServicer(state), QUERY_ROLES, auth, observe=observe),
        )
    )
    # Mutual TLS is required: a caller without a certificate signed by the client CA is refused at the
    # handshake, before any RPC (its client sees UNAVAILABLE).
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="curator")
    return common_server.finish_server(
        server, serde.SERVICE_NAMES, cfg.host, cfg.port, server_tls, health_state=state.health
    )
