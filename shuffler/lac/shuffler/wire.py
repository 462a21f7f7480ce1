"""Every protobuf byte layout the shuffler builds or scans by hand, in one place.

On the hot paths (a Submit's acknowledgements, buffering a report, releasing a batch) building
message objects cost more than the durable commit they serve, so these functions write or scan
the wire format directly. Each equals a generated message's serialization, which
``tests/shuffler/test_wire.py`` checks round trip against ``lac.common.v1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lac.common.rpc import LENGTH_DELIMITED, count_field
from lac.common.v1 import curator_pb2, shuffler_pb2

__all__ = [
    "varint",
    "length_delimited",
    "batch_entry",
    "batch_header",
    "with_privacy",
    "submit_response",
    "count_reports",
]

_BATCH = curator_pb2.IngestBatchRequest.DESCRIPTOR.fields_by_name
_ACK = shuffler_pb2.ReportAck.DESCRIPTOR.fields_by_name
_SUBMIT_REPORTS = shuffler_pb2.SubmitRequest.DESCRIPTOR.fields_by_name["reports"].number
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def varint(n: int) -> bytes:
    """A non-negative integer as a protobuf base-128 varint."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:
        raise ValueError("varint of a negative number")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(number: int, body: bytes) -> bytes:
    """Field ``number`` holding ``body`` (bytes, string or an embedded message)."""
    return varint((number << 3) | LENGTH_DELIMITED) + varint(len(body)) + body


def batch_entry(payload: bytes) -> bytes:
    """One ``IngestBatchRequest.reports`` entry holding a serialized ``SealedPayload``: batches are
    the header followed by the concatenation of their entries."""
    return length_delimited(_BATCH["reports"].number, payload)


def batch_header(batch_id: str) -> bytes:
    """The start of a serialized ``IngestBatchRequest``: its ``batch_id``."""
    return length_delimited(_BATCH["batch_id"].number, batch_id.encode())


def with_privacy(body: bytes, privacy: bytes) -> bytes:
    """A serialized ``IngestBatchRequest`` with its ``privacy`` field (a serialized ``BatchPrivacy``)
    appended: protobuf fields may come in any order."""
    return body + length_delimited(_BATCH["privacy"].number, privacy)


_STATUS_TAG = varint((_ACK["status"].number << 3) | 0)
_STATUS = {
    True: _STATUS_TAG + varint(shuffler_pb2.ACK_STATUS_STORED),
    False: _STATUS_TAG + varint(shuffler_pb2.ACK_STATUS_DUPLICATE),
}
_ACKS = shuffler_pb2.SubmitResponse.DESCRIPTOR.fields_by_name["acks"].number


def submit_response(idempotency_ids: Iterable[bytes], stored: Sequence[bool]) -> bytes:
    """The serialized ``SubmitResponse``: one ``ReportAck`` per report, STORED or DUPLICATE."""
    ack_id = _ACK["idempotency_id"].number
    return b"".join(
        length_delimited(_ACKS, length_delimited(ack_id, idem) + _STATUS[s])
        for idem, s in zip(idempotency_ids, stored, strict=True)
    )


def count_reports(raw: bytes, stop_after: int) -> int:
    """Entries of ``reports`` at the top level of a serialized ``SubmitRequest``, counted without
    parsing and at most ``stop_after + 1`` (``lac.common.rpc.count_field``)."""
    return count_field(raw, _SUBMIT_REPORTS, stop_after)
