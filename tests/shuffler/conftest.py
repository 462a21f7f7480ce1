"""Shuffler test helpers: plaintext reports and a real gRPC CuratorIngest that records the wire."""

from __future__ import annotations

import os
import time

import pytest

from lac.common.v1 import reports_pb2, shuffler_pb2
from lac_testkit import ServeProc, Sink, tag_of  # noqa: F401 - re-exported for the shuffler tests


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


def free_port() -> int:
    """A loopback port that was free a moment ago: for shard lists, which name the replicas' addresses
    before the replicas start."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_replica(start_shuffler, tmp_path):
    """Factory: ``start_replica(port, curator, **overrides)`` runs an in-process shuffler on
    127.0.0.1:``port`` (a port chosen first, so that shard lists can name it) with token
    authentication and the tokens file ``tmp_path / "replicas.tokens"`` shared by all replicas.
    Stopped at teardown; ``.stop()`` earlier frees the port for a restart."""

    def start(port: int, curator: str, **overrides):
        overrides.setdefault("state_dir", tmp_path / f"replica-{port}")
        overrides.setdefault("tokens_file", tmp_path / "replicas.tokens")
        overrides.setdefault("auth", "token")
        return start_shuffler(curator, port=port, **overrides)

    return start
