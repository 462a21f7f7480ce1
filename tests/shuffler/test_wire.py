"""The shuffler's hand-built wire bytes (``lac.shuffler.wire``) equal the generated messages."""

from __future__ import annotations

import os
import random

import pytest

from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2
from lac.shuffler import wire

# Lengths around each varint boundary (1, 2 and 3 bytes).
SIZES = (0, 1, 127, 128, 300, 16383, 16384, 70000)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 255, 16383, 16384, 2**31 - 1, 2**32, 2**63 - 1])
def test_varint_parses_back(n):
    parsed = reports_pb2.DeploymentRequest()  # any message: an unknown varint field 1000 keeps its value
    raw = wire.varint((1000 << 3) | 0) + wire.varint(n)
    parsed.ParseFromString(raw)
    assert parsed.SerializeToString() == raw


def test_negative_varint_is_refused():
    with pytest.raises(ValueError):
        wire.varint(-1)


def test_a_batch_is_its_header_entries_and_privacy():
    rng = random.Random(7)
    payloads = [
        reports_pb2.SealedPayload(
            encoding=reports_pb2.PAYLOAD_ENCODING_HPKE_X25519_SHA256_CHACHAPOLY,
            key_id="k" * 16,
            data=os.urandom(rng.choice(SIZES)),
        )
        for _ in range(20)
    ]
    privacy = reports_pb2.BatchPrivacy(
        reports_per_window=1,
        window_seconds=86400.0,
        first_window=3,
        last_window=4,
        distinct_clients=True,
        statement="x" * 300,
    )
    body = wire.batch_header("b" * 32) + b"".join(wire.batch_entry(p.SerializeToString()) for p in payloads)
    raw = wire.with_privacy(body, privacy.SerializeToString())
    expected = curator_pb2.IngestBatchRequest(batch_id="b" * 32, reports=payloads, privacy=privacy)
    assert raw == expected.SerializeToString()  # same field order: batch_id, reports, privacy
    assert curator_pb2.IngestBatchRequest.FromString(raw) == expected


def test_hand_built_acks_equal_protobuf_serialization():
    ids = [os.urandom(n) for n in (8, 16, 64, 200)]
    stored = [True, False, True, False]
    expected = shuffler_pb2.SubmitResponse(
        acks=[
            shuffler_pb2.ReportAck(
                idempotency_id=i, status=shuffler_pb2.ACK_STATUS_STORED if s else shuffler_pb2.ACK_STATUS_DUPLICATE
            )
            for i, s in zip(ids, stored)
        ]
    )
    assert wire.submit_response(ids, stored) == expected.SerializeToString()
    assert wire.submit_response([], []) == b""


def test_counting_reports_without_parsing():
    reports = [
        shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16), crowd_id="c", payload=reports_pb2.SealedPayload(data=os.urandom(n))
        )
        for n in SIZES
    ]
    raw = shuffler_pb2.SubmitRequest(reports=reports).SerializeToString()
    assert wire.count_reports(raw, stop_after=100) == len(SIZES)
    assert wire.count_reports(raw, stop_after=3) == 4  # stops one past the limit
    assert wire.count_reports(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 10) <= 1  # malformed: ends early
    assert wire.count_reports(b"", 10) == 0
