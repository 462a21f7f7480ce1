"""gRPC servicer (thin: parse with ``serde``, one handler call, reply with ``serde``) and server factory for the
shuffler.

Every method of ``lac.v1.Shuffler`` is registered from the generated descriptor with the roles
it serves (``ROLES``); ``lac.common.rpc`` identifies the caller, checks the role and parses
the request before a method runs.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import grpc

from lac.common import server as common_server
from lac.common import tls
from lac.common.errors import InvalidArgument, RejectReason
from lac.common.rpc import Caller, Receiving, Role, count_field, service_handler
from lac.common.v1 import shuffler_pb2
from lac.shuffler import forward, intake, releases, serde, shards, status, wire
from lac.shuffler.forward import MAX_BATCH_ID_CHARS, MAX_DEAD_LETTER_IDS
from lac.shuffler.shards import SHARD_METADATA_KEY, SHARDS_DIGEST_METADATA_KEY, ShardListMismatch, WrongShard
from lac.shuffler.state import ShufflerState

log = logging.getLogger(__name__)

SERVICE = serde.SERVICE
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


def _bounded_reports(state: ShufflerState):
    """A ``before_parse`` check of Submit and SubmitStream messages: more reports than
    ``max_reports_per_request`` are refused (and counted) before parsing, since parsed an empty report
    costs ~70 bytes of memory for its 2 bytes on the wire (a large message of them would take gigabytes).
    ``lac.common.rpc`` runs it only for callers with the client role, after receiving their message."""
    limit = state.config.max_reports_per_request

    def check(raw: bytes) -> None:
        if len(raw) > SCAN_ABOVE_BYTES and wire.count_reports(raw, limit) > limit:
            state.count_reject(RejectReason.INVALID_ARGUMENT)
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


@contextmanager
def _naming_the_right_shard(context):
    """Put the right replica's address in the trailing metadata of a wrong-shard refusal (``lac-shard``), or this
    replica's shard-list digest in that of a refusal for another list (``lac-shards-digest``), so the SDK can act
    on it without parsing the message; ``lac.common.rpc`` then answers FAILED_PRECONDITION."""
    try:
        yield
    except WrongShard as refusal:
        context.set_trailing_metadata(((SHARD_METADATA_KEY, refusal.shard),))
        raise
    except ShardListMismatch as refusal:
        context.set_trailing_metadata(((SHARDS_DIGEST_METADATA_KEY, refusal.own),))
        raise


def _sent_digest(context) -> str | None:
    """The shard-list digest the client's Submit carries (None: it sent none, e.g. an older SDK)."""
    values = [v for k, v in (context.invocation_metadata() or ()) if k == SHARDS_DIGEST_METADATA_KEY]
    return values[0] if len(values) == 1 and isinstance(values[0], str) else None


class ShufflerServicer:
    """The ``lac.v1.Shuffler`` methods (roles in ``ROLES``): each parses through ``serde``, calls one handler over
    the ``ShufflerState`` and replies through ``serde``."""

    def __init__(self, state: ShufflerState):
        self.state = state

    async def Submit(self, request, context, caller: Caller):
        submission = serde.submission(request, self.state.config)
        with _naming_the_right_shard(context):
            ack = await intake.submit(self.state, submission, caller.identity, _sent_digest(context))
        return serde.submit_reply([ack])

    async def SubmitStream(self, requests, context, caller: Caller):
        submissions = serde.submissions(requests, self.state.config)
        with _naming_the_right_shard(context):  # raised by the first message, before anything is stored
            acks = await intake.submit_stream(self.state, submissions, caller.identity, _sent_digest(context))
        return serde.submit_reply(acks)

    async def GetDeployment(self, request, context, caller: Caller):
        return serde.deployment_reply(forward.known_deployment(self.state))

    async def GetStatus(self, request, context, caller: Caller):
        return serde.status_reply(await status.status(self.state))

    async def Flush(self, request, context, caller: Caller):
        return serde.flush_reply(await releases.flush(self.state))

    async def GetShards(self, request, context, caller: Caller):
        return serde.shard_assignment_reply(shards.assignment(self.state, caller.identity))

    async def ListDeadLetters(self, request, context, caller: Caller):
        return serde.dead_letters_reply(await forward.dead_letters(self.state))

    async def RetryDeadLetters(self, request, context, caller: Caller):
        batch_ids, every = serde.selection(request)
        return serde.settled_reply(await forward.settle_dead_letters(self.state, batch_ids, every, drop=False))

    async def DropDeadLetters(self, request, context, caller: Caller):
        batch_ids, every = serde.selection(request)
        return serde.settled_reply(await forward.settle_dead_letters(self.state, batch_ids, every, drop=True))


def create_server(state: ShufflerState) -> tuple[grpc.aio.Server, int]:
    """Build (not start) the gRPC server over a shuffler's ``state``, bound as its config says."""
    cfg = state.config
    server = common_server.new_server(
        cfg.max_message_bytes,
        cfg.max_concurrent_streams,
        cfg.max_connections,
        trace_callers="link" if cfg.trace_link_callers else "root",  # never a child of an app's span
    )

    async def count_malformed(method: str) -> None:
        state.count_reject(RejectReason.MALFORMED)

    handler = service_handler(
        SERVICE,
        ShufflerServicer(state),
        ROLES,
        state.auth,
        on_malformed=count_malformed,
        observe=state.metrics.rpc,
        before_parse={
            "Submit": _bounded_reports(state),
            "SubmitStream": _bounded_reports(state),
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
        server, [serde.SERVICE_NAME], cfg.host, cfg.port, server_tls, health_state=state.health
    )
