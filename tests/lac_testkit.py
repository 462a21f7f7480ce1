"""Helpers shared by tests: report contents that satisfy the default deployment, batch statements."""

from __future__ import annotations

import os
import threading
import time

import grpc

from lac.common.deployment import Deployment
from lac.common.serde import mechanism_id
from lac.common.v1 import curator_pb2, reports_pb2

DEPLOYMENT = Deployment()  # what a curator with the default configuration publishes


def content(*sentences: list[str], report_id: bytes | None = None, epsilon: float = 1.0,
            mechanism: str = DEPLOYMENT.mechanism, embedding: str = DEPLOYMENT.embedding) -> reports_pb2.ReportContent:
    """A report's sealed content with the given sentences and typed local parameters."""
    return reports_pb2.ReportContent(
        report_id=report_id or os.urandom(16), sentences=[reports_pb2.Sentence(tokens=s) for s in sentences],
        local_privacy=reports_pb2.LocalPrivacy(mechanism=mechanism_id(mechanism), epsilon_per_word=epsilon,
                                               embedding=embedding))


def tag_of(p: reports_pb2.SealedPayload) -> bytes:
    """The report id inside a plaintext payload."""
    return reports_pb2.ReportContent.FromString(p.data).report_id


def batch_privacy(n: int, deployment: Deployment = DEPLOYMENT, window: int | None = None) -> reports_pb2.BatchPrivacy:
    """What a shuffler with a matching quota attaches to a batch of ``n`` reports of distinct clients."""
    w = deployment.window(time.time()) if window is None else window
    return reports_pb2.BatchPrivacy(n_reports=n, distinct_clients=True, reports_per_window=deployment.reports_per_window,
                                    window_seconds=deployment.window_seconds, first_window=w, last_window=w)


class Sink:
    """A real gRPC server standing in for the curator (sync, own thread pool): CuratorIngest keeps
    every request's raw bytes; Curator.GetDeployment publishes ``deployment``."""

    def __init__(self, port: int = 0):
        from lac.common.deployment import Deployment

        self.raw: list[bytes] = []
        self.down = False
        self.deployment = Deployment()
        self._lock = threading.Lock()
        from concurrent import futures
        self.server = grpc.server(futures.ThreadPoolExecutor(4), options=[
            ("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        handler = grpc.unary_unary_rpc_method_handler(
            self._ingest, request_deserializer=None,
            response_serializer=curator_pb2.IngestBatchResponse.SerializeToString)
        deployment = grpc.unary_unary_rpc_method_handler(
            self._deployment, request_deserializer=None, response_serializer=reports_pb2.Deployment.SerializeToString)
        self.server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("lac.v1.CuratorIngest", {"IngestBatch": handler}),
            grpc.method_handlers_generic_handler("lac.v1.Curator", {"GetDeployment": deployment})])
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

    def _deployment(self, raw: bytes, context):
        from lac.common.serde import deployment_to_proto

        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sink is down")
        return deployment_to_proto(self.deployment)

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
