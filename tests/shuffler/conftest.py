"""Shuffler test helpers: plaintext reports and a real gRPC CuratorIngest that records the wire."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2


def payload(tag: bytes, size: int = 0) -> reports_pb2.SealedPayload:
    """A plaintext payload whose content is a ReportContent with report_id = ``tag``."""
    content = reports_pb2.ReportContent(report_id=tag, sentences=[reports_pb2.Sentence(tokens=["x" * size or "w"])])
    return reports_pb2.SealedPayload(encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE,
                                     data=content.SerializeToString())


def report(tag: bytes | None = None, crowd: str = "", idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    return shuffler_pb2.ClientReport(idempotency_id=idem or os.urandom(16), payload=payload(tag or os.urandom(16)),
                                     crowd_id=crowd)


def tag_of(p: reports_pb2.SealedPayload) -> bytes:
    return reports_pb2.ReportContent.FromString(p.data).report_id


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class Sink:
    """A real CuratorIngest gRPC server (sync, own thread pool) that keeps every request's raw bytes."""

    def __init__(self, port: int = 0):
        self.raw: list[bytes] = []
        self.down = False
        self._lock = threading.Lock()
        from concurrent import futures
        self.server = grpc.server(futures.ThreadPoolExecutor(4), options=[
            ("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        handler = grpc.unary_unary_rpc_method_handler(
            self._ingest, request_deserializer=None,
            response_serializer=curator_pb2.IngestBatchResponse.SerializeToString)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "lac.v1.CuratorIngest", {"IngestBatch": handler})])
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ingest(self, raw: bytes, context):
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sink is down")
        request = curator_pb2.IngestBatchRequest.FromString(raw)
        with self._lock:
            self.raw.append(raw)
        return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, accepted=len(request.reports))

    def batches(self) -> dict[str, curator_pb2.IngestBatchRequest]:
        """Distinct batches received (a batch re-sent after a crash has the same id and bytes)."""
        with self._lock:
            raws = list(self.raw)
        out = {}
        for raw in raws:
            b = curator_pb2.IngestBatchRequest.FromString(raw)
            out.setdefault(b.batch_id, b)
        return out

    def tags(self) -> list[bytes]:
        return [tag_of(p) for b in self.batches().values() for p in b.reports]

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()
