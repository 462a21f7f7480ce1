"""Shuffler test helpers: plaintext reports, a free loopback port, and the shared helpers the shuffler
tests use (a real gRPC CuratorIngest that records the wire, a real ``lac shuffler serve`` process)."""

from __future__ import annotations

import os

from lac_testkit import ServeProc, Sink, content, free_port, tag_of  # noqa: F401 - re-exported for the shuffler tests
from lac_testkit import wait_until as wait_for  # noqa: F401

from lac.common.v1 import reports_pb2, shuffler_pb2


def payload(tag: bytes, size: int = 0) -> reports_pb2.SealedPayload:
    """A plaintext payload whose content is a ReportContent with report_id = ``tag``."""
    c = content(["x" * size or "w"], report_id=tag)
    return reports_pb2.SealedPayload(
        encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=c.SerializeToString()
    )


def report(tag: bytes | None = None, crowd: str = "", idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    """A client report carrying ``payload(tag)`` (random tag and idempotency id unless given)."""
    return shuffler_pb2.ClientReport(
        idempotency_id=idem or os.urandom(16), payload=payload(tag or os.urandom(16)), crowd_id=crowd
    )
