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
from lac.common.errors import InvalidArgument, RejectReason
from lac.common.rpc import Caller, Receiving, Role, count_field, service_handler
from lac.common.v1 import shuffler_pb2
from lac.shuffler import wire
from lac.shuffler.service import (
    MAX_BATCH_ID_CHARS,
    MAX_DEAD_LETTER_IDS,
    SERVICE_NAME,
    ShardListMismatch,
    Shuffler,
    WrongShard,
)
from lac.shuffler.shards import SHARD_METADATA_KEY, SHARDS_DIGEST_METADATA_KEY

log = logging.getLogger(__name__)

SERVICE = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"]
SCAN_ABOVE_BYTES = 64 * 1024  # Submit messages larger than this have their reports counted before parsing
_SELECTED_IDS = shuffler_pb2.DeadLetterSelection.DESCRIPTOR.fields_by_name["batch_ids"].number

ROLES = {
    "Submit": {Role.CLIENT},
    "SubmitStream": {Role.CLIENT},
    "GetDeployment": {Role.CLIENT, Role.OPERATOR},
    "GetStatus": {Role.OPERATOR},
    "Flush": {Role.OPERATOR},
    "GetShards": {Role.CLIENT, Role.OPERATOR},
    "ListDeadLetters": {Role.OPERATOR},
    "RetryDeadLetters": {Role.OPERATOR},
    "DropDeadLetters": {Role.OPERATOR},
}


def _bounded_reports(shuffler: Shuffler):
    """A ``before_parse`` check of Submit and SubmitStream messages: more reports than
    ``max_reports_per_request`` are refused (and counted) before parsing, since parsed an empty report
    costs ~70 bytes of memory for its 2 bytes on the wire (a large message of them would take gigabytes).
    ``lac.common.rpc`` runs it only for callers with the client role, after receiving their message."""
    limit = shuffler.config.max_reports_per_request

    def check(raw: bytes) -> None:
        if len(raw) > SCAN_ABOVE_BYTES and wire.count_reports(raw, limit) > limit:
            shuffler._log.count_reject(RejectReason.INVALID_ARGUMENT)
            raise InvalidArgument(f"more than {limit} reports in one request (max_reports_per_request)")

    return check


def _bounded_selection(raw: bytes) -> None:
    """A ``before_parse`` check of RetryDeadLetters and DropDeadLetters: at most ``MAX_DEAD_LETTER_IDS`` batch ids
    of at most ``MAX_BATCH_ID_CHARS`` characters, refused before parsing (many short ids parse into far more memory
    than their bytes)."""
    if len(raw) > MAX_DEAD_LETTER_IDS * (MAX_BATCH_ID_CHARS + 3) + 2 or (
        count_field(raw, _SELECTED_IDS, MAX_DEAD_LETTER_IDS) > MAX_DEAD_LETTER_IDS
    ):
        raise InvalidArgument(
            f"at most {MAX_DEAD_LETTER_IDS} batch ids of at most {MAX_BATCH_ID_CHARS} characters (or all)"
        )


def _name_the_right_shard(context, refusal: WrongShard | ShardListMismatch) -> None:
    """Put the right replica's address in the trailing metadata of a wrong-shard refusal (``lac-shard``), or this
    replica's shard-list digest in that of a refusal for another list (``lac-shards-digest``), so the SDK can act
    on it without parsing the message; ``lac.common.rpc`` then answers FAILED_PRECONDITION."""
    if isinstance(refusal, WrongShard):
        context.set_trailing_metadata(((SHARD_METADATA_KEY, refusal.shard),))
    else:
        context.set_trailing_metadata(((SHARDS_DIGEST_METADATA_KEY, refusal.own),))


def _sent_digest(context) -> str | None:
    """The shard-list digest the client's Submit carries (None: it sent none, e.g. an older SDK)."""
    values = [v for k, v in (context.invocation_metadata() or ()) if k == SHARDS_DIGEST_METADATA_KEY]
    return values[0] if len(values) == 1 and isinstance(values[0], str) else None


class ShufflerServicer:
    """The ``lac.v1.Shuffler`` methods (roles in ``ROLES``); the work is in ``Shuffler``."""

    def __init__(self, shuffler: Shuffler):
        self.shuffler = shuffler

    async def Submit(self, request, context, caller: Caller):
        try:
            stored = await self.shuffler.submit(request.reports, caller.identity, _sent_digest(context))
            return wire.submit_response((r.idempotency_id for r in request.reports), stored)
        except (WrongShard, ShardListMismatch) as exc:
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
                stored = await self.shuffler.submit(request.reports, caller.identity, _sent_digest(context))
            except (WrongShard, ShardListMismatch) as exc:  # raised by the first message, before anything is stored
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

    async def ListDeadLetters(self, request, context, caller: Caller):
        return await self.shuffler.dead_letters()

    async def RetryDeadLetters(self, request, context, caller: Caller):
        return await self.shuffler.settle_dead_letters(list(request.batch_ids), request.all, drop=False)

    async def DropDeadLetters(self, request, context, caller: Caller):
        return await self.shuffler.settle_dead_letters(list(request.batch_ids), request.all, drop=True)


def create_server(shuffler: Shuffler) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server for ``shuffler``, bound as its config says."""
    cfg = shuffler.config
    server = common_server.new_server(
        cfg.max_message_bytes,
        cfg.max_concurrent_streams,
        cfg.max_connections,
        trace_callers="link" if cfg.trace_link_callers else "root",  # never a child of an app's span
    )

    async def count_malformed(method: str) -> None:
        await shuffler.count_reject(RejectReason.MALFORMED)

    handler = service_handler(
        SERVICE,
        ShufflerServicer(shuffler),
        ROLES,
        shuffler.auth,
        on_malformed=count_malformed,
        observe=shuffler.metrics.rpc,
        before_parse={
            "Submit": _bounded_reports(shuffler),
            "SubmitStream": _bounded_reports(shuffler),
            "RetryDeadLetters": _bounded_selection,
            "DropDeadLetters": _bounded_selection,
        },
        receiving=Receiving(cfg.receive_timeout_seconds, "receive_timeout_seconds"),
    )
    server.add_generic_rpc_handlers((handler,))
    # With a client CA every caller must present a certificate (gRPC cannot ask for an optional one);
    # without, callers are identified by bearer tokens only.
    server_tls = tls.server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, insecure=cfg.insecure, name="shuffler")
    return common_server.finish_server(
        server, [SERVICE_NAME], cfg.host, cfg.port, server_tls, health_state=shuffler.health
    )
