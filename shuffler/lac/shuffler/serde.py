"""The shuffler's translations between the generated messages (``lac.common.v1``) and its domain objects: every
message it reads or builds, as a server (``lac.v1.Shuffler``) and as a client of the curator (``GetDeployment``,
``IngestBatch``'s acknowledgement, a batch's statement). Large messages are cut by hand in ``wire.py``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import grpc

from lac.common import envelope
from lac.common.deployment import Deployment
from lac.common.envelope import PayloadRejected
from lac.common.errors import InvalidArgument, RejectReason
from lac.common.privacy import Guarantee
from lac.common.serde import deployment_from_proto, deployment_to_proto
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2
from lac.common.version import server_version
from lac.shuffler import wire

if TYPE_CHECKING:
    from lac.shuffler.config import ShufflerConfig
    from lac.shuffler.forward import DeadLetter, Settled
    from lac.shuffler.intake import Acknowledged
    from lac.shuffler.releases import FlushResult
    from lac.shuffler.reportlog import StoredBatch
    from lac.shuffler.shards import ShardAssignment
    from lac.shuffler.status import Status

SERVICE = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"]
SERVICE_NAME = SERVICE.full_name
MIN_IDEMPOTENCY_BYTES = 8
MAX_IDEMPOTENCY_BYTES = 64
MAX_KEY_ID_CHARS = 256
MAX_CROWD_ID_CHARS = 256
_INGEST_METHOD = "/lac.v1.CuratorIngest/IngestBatch"


# ------------------------------------------------------------------ Submit, SubmitStream


@dataclass(frozen=True)
class Submission:
    """One Submit message's reports as ``serde.submission`` read them: ``items`` are (idempotency id, crowd id,
    serialized payload) per report; ``invalid`` is the reason they are refused, raised after the shard check."""

    count: int
    idempotency_ids: tuple[bytes, ...]
    items: tuple[tuple[bytes, str | None, bytes], ...] = ()
    invalid: InvalidArgument | None = None


def submission(request: shuffler_pb2.SubmitRequest, config: ShufflerConfig) -> Submission:
    """One Submit message's reports, checked: (idempotency id, crowd id, serialized payload) per report, or the
    InvalidArgument that refuses them (``Submission.invalid``, raised by the handler after its shard check)."""
    reports = request.reports
    ids = tuple(r.idempotency_id for r in reports)
    try:
        items = _validate(reports, config)
    except InvalidArgument as exc:
        return Submission(len(reports), ids, invalid=exc)
    return Submission(len(reports), ids, tuple(items))


def _validate(reports, config: ShufflerConfig) -> list[tuple[bytes, str | None, bytes]]:
    """(idempotency id, crowd id, serialized payload) per report, or InvalidArgument."""
    cfg = config
    if not reports:
        raise InvalidArgument("no reports in request")
    if len(reports) > cfg.max_reports_per_request:
        raise InvalidArgument(f"{len(reports)} reports in one request; at most {cfg.max_reports_per_request}")
    out = []
    unspecified = reports_pb2.PAYLOAD_ENCODING_UNSPECIFIED
    for i, r in enumerate(reports):
        if not MIN_IDEMPOTENCY_BYTES <= len(r.idempotency_id) <= MAX_IDEMPOTENCY_BYTES:
            raise InvalidArgument(
                f"report {i}: idempotency_id must be {MIN_IDEMPOTENCY_BYTES}.."
                f"{MAX_IDEMPOTENCY_BYTES} bytes, got {len(r.idempotency_id)}"
            )
        p = r.payload
        if p.encoding == unspecified:
            raise PayloadRejected(RejectReason.UNSPECIFIED_ENCODING, f"report {i}: payload encoding is unspecified")
        try:
            envelope.check_shape(p, cfg.allow_plaintext_payloads, cfg.max_report_bytes)
        except PayloadRejected as exc:
            raise PayloadRejected(exc.reason, f"report {i}: {exc}") from None
        if len(p.key_id) > MAX_KEY_ID_CHARS or len(r.crowd_id) > MAX_CROWD_ID_CHARS:
            raise InvalidArgument(f"report {i}: key_id or crowd_id longer than {MAX_KEY_ID_CHARS} characters")
        out.append((r.idempotency_id, r.crowd_id or None, p.SerializeToString()))
    return out


async def submissions(requests, config: ShufflerConfig):
    """A SubmitStream call's messages as ``Submission`` values, as they arrive."""
    async for request in requests:
        yield submission(request, config)


def submit_reply(acks: Iterable[Acknowledged]) -> bytes:
    """The serialized ``SubmitResponse`` of a Submit's one message (or of a SubmitStream's, concatenated)."""
    return b"".join(wire.submit_response(a.submission.idempotency_ids, a.stored) for a in acks)


# ------------------------------------------------------------------ the other RPCs


def deployment_reply(deployment: Deployment) -> reports_pb2.Deployment:
    """The curator's deployment as this shuffler relays it (``server_version`` names this shuffler)."""
    return deployment_to_proto(deployment, server_version=server_version("shuffler"))


def _message(cls, obj, **overrides):
    """A ``cls`` message of the frozen dataclass ``obj``, whose fields are the message's by name (``overrides``
    replace some)."""
    return cls(**{f.name: getattr(obj, f.name) for f in fields(obj)} | overrides)


def _privacy(raw: bytes) -> reports_pb2.BatchPrivacy:
    return reports_pb2.BatchPrivacy.FromString(raw)


def status_reply(s: Status) -> shuffler_pb2.ShufflerStatus:
    """``GetStatus``'s answer."""
    batches = [_message(shuffler_pb2.BatchInfo, b, privacy=_privacy(b.privacy)) for b in s.recent_batches]
    return _message(shuffler_pb2.ShufflerStatus, s, recent_batches=batches)


def flush_reply(result: FlushResult) -> shuffler_pb2.FlushResponse:
    """``Flush``'s answer: the batch released, if any, and why."""
    if not result.released:
        return shuffler_pb2.FlushResponse(released=False, note=result.note)
    return shuffler_pb2.FlushResponse(
        released=True, batch_id=result.batch_id, batch_size=result.batch_size, note=result.note
    )


def shard_assignment_reply(a: ShardAssignment) -> shuffler_pb2.ShardAssignment:
    """``GetShards``'s answer."""
    return _message(shuffler_pb2.ShardAssignment, a)


def dead_letters_reply(letters: tuple[DeadLetter, ...]) -> shuffler_pb2.DeadLetters:
    """``ListDeadLetters``'s answer, oldest first."""
    return shuffler_pb2.DeadLetters(
        batches=[_message(shuffler_pb2.DeadLetter, d, privacy=_privacy(d.privacy)) for d in letters]
    )


def selection(request: shuffler_pb2.DeadLetterSelection) -> tuple[list[str], bool]:
    """The dead letters a Retry/DropDeadLetters call names, and whether it asks for all of them."""
    return list(request.batch_ids), request.all


def settled_reply(settled: Settled) -> shuffler_pb2.DeadLetterResult:
    """Retry/DropDeadLetters' answer."""
    return _message(shuffler_pb2.DeadLetterResult, settled)


# ------------------------------------------------------------------ the curator's messages


def deployment_from_bytes(raw: bytes) -> Deployment:
    """A serialized ``Deployment`` (the report log's cache of the last one fetched)."""
    return deployment_from_proto(reports_pb2.Deployment.FromString(raw))


async def fetch_deployment(channel) -> tuple[Deployment, bytes]:
    """The curator's published deployment over ``channel`` and its bytes (to cache); grpc.aio.AioRpcError if
    the call fails."""
    reply = await curator_pb2_grpc.CuratorStub(channel).GetDeployment(reports_pb2.DeploymentRequest(), timeout=30)
    return deployment_from_proto(reply), reply.SerializeToString()


@dataclass(frozen=True)
class IngestAck:
    """The curator's acknowledgement of a batch."""

    accepted: int
    rejected: int
    duplicate: bool


def _ingest_ack(raw: bytes) -> IngestAck:
    reply = curator_pb2.IngestBatchResponse.FromString(raw)
    return IngestAck(reply.accepted, reply.rejected, reply.duplicate)


def ingest_call(channel) -> grpc.aio.UnaryUnaryMultiCallable[bytes, IngestAck]:
    """``IngestBatch`` over ``channel``, sending raw bytes: the batch's request is built once from the log
    (``wire``) and sent as built."""
    return channel.unary_unary(_INGEST_METHOD, request_serializer=None, response_deserializer=_ingest_ack)


def batch_privacy(
    batch: StoredBatch, deployment: Deployment, config: ShufflerConfig, g: Guarantee, method: str
) -> bytes:
    """The serialized ``BatchPrivacy`` of ``batch``: its guarantee ``g`` (by accounting ``method``) and the
    privacy unit it was taken under."""
    cfg = config
    return reports_pb2.BatchPrivacy(
        n_reports=batch.n,
        report_epsilon0=deployment.report_epsilon0,
        delta=g.delta,
        central_epsilon=g.epsilon,
        amplified=method != "none",
        method=method,
        subsample_q=cfg.subsample_q,
        crowd_threshold=cfg.crowd_threshold,
        statement=g.statement(),
        distinct_clients=batch.distinct_clients,
        reports_per_window=cfg.reports_per_window,
        window_seconds=cfg.window_seconds,
        first_window=batch.first_window,
        last_window=batch.last_window,
        windows_per_period=cfg.max_windows_per_client_per_period,
        period_seconds=cfg.period_days * 86400.0,
    ).SerializeToString()
