"""Shuffler test helpers: plaintext reports and a real gRPC CuratorIngest that records the wire."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from lac.common.v1 import reports_pb2, shuffler_pb2
from lac_testkit import Sink, tag_of  # noqa: F401 - re-exported for the shuffler tests


def payload(tag: bytes, size: int = 0) -> reports_pb2.SealedPayload:
    """A plaintext payload whose content is a ReportContent with report_id = ``tag``."""
    from lac_testkit import content

    c = content(["x" * size or "w"], report_id=tag)
    return reports_pb2.SealedPayload(encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE,
                                     data=c.SerializeToString())


def report(tag: bytes | None = None, crowd: str = "", idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    return shuffler_pb2.ClientReport(idempotency_id=idem or os.urandom(16), payload=payload(tag or os.urandom(16)),
                                     crowd_id=crowd)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()
