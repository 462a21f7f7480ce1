"""Sending privatized reports to the shuffler.

Each report gets a fresh random report id (inside the sealed content, for the curator's
replay protection) and a separate random idempotency id (outside, for the shuffler):
the shuffler never sees the id the curator sees. Retrying a call reuses the same
idempotency ids, so a retry is stored once. Content is HPKE-sealed to the curator's
public key; the channel is TLS and the client authenticates with a bearer token (or
an mTLS certificate). Plaintext payloads and channels need ``insecure=True``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

import grpc

from lac.common import envelope, tls
from lac.common.deployment import Deployment
from lac.common.envelope import CuratorPublicKey
from lac.common.serde import deployment_from_proto, mechanism_id
from lac.common.v1 import reports_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.client.localizer import PrivatizedReport

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def report_content(report: PrivatizedReport) -> reports_pb2.ReportContent:
    """What the curator will read: a fresh report id, the perturbed words and the typed local
    parameters (mechanism, ε per word, embedding id), nothing else."""
    return reports_pb2.ReportContent(
        report_id=os.urandom(envelope.REPORT_ID_BYTES),
        sentences=[reports_pb2.Sentence(tokens=list(s)) for s in report.sentences],
        local_privacy=reports_pb2.LocalPrivacy(mechanism=mechanism_id(report.mechanism),
                                               epsilon_per_word=report.epsilon_per_word, embedding=report.embedding))


def client_report(report: PrivatizedReport, curator_key: CuratorPublicKey | None) -> shuffler_pb2.ClientReport:
    """A report ready for the shuffler: sealed to ``curator_key`` (None = plaintext, demos only)."""
    content = report_content(report)
    payload = envelope.seal(content, curator_key) if curator_key else envelope.seal_insecure(content)
    return shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload)


class ShufflerClient:
    """Submits reports to a shuffler over gRPC, many per call, retrying transient failures.

    Production use needs ``curator_key`` (reports are sealed to it) and ``tls`` (the CA
    that signed the shuffler's certificate, optionally a client certificate), plus a
    ``token`` unless the client certificate identifies the client. ``insecure=True``
    allows plaintext payloads and channels for local demos only.
    """

    def __init__(self, target: str, curator_key: CuratorPublicKey | None = None, tls_config: tls.ClientTls | None = None,
                 token: str | None = None, insecure: bool = False, batch_size: int = 100, attempts: int = 5,
                 timeout: float = 30.0):
        if not insecure and (curator_key is None or tls_config is None):
            raise ValueError("ShufflerClient needs the curator's public key and TLS settings "
                             "(or insecure=True for a local demo)")
        self.curator_key = curator_key
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = tls.channel(target, tls_config)
        self.stub = shuffler_pb2_grpc.ShufflerStub(self.channel)
        self.batch_size = batch_size
        self.attempts = attempts
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, metadata=None):
        """``method(request)`` with retries of transient failures (exponential back-off)."""
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            try:
                return method(request, timeout=self.timeout, wait_for_ready=True,
                              metadata=self.metadata if metadata is None else metadata)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or attempt == self.attempts:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def deployment(self) -> Deployment:
        """The curator's published local-privacy configuration, relayed by the shuffler."""
        return deployment_from_proto(self._call(self.stub.GetDeployment, reports_pb2.DeploymentRequest()))

    def submit(self, reports: Iterable[PrivatizedReport], token: str | None = None) -> list[shuffler_pb2.ReportAck]:
        """Submit ``reports``; returns one ack per report (STORED or DUPLICATE).

        ``token`` overrides this client's token for this call (e.g. a simulation playing many clients).
        """
        acks: list[shuffler_pb2.ReportAck] = []
        chunk: list[shuffler_pb2.ClientReport] = []
        for r in reports:
            chunk.append(client_report(r, self.curator_key))
            if len(chunk) == self.batch_size:
                acks.extend(self.submit_prepared(chunk, token))
                chunk = []
        if chunk:
            acks.extend(self.submit_prepared(chunk, token))
        return acks

    def submit_prepared(self, chunk: Sequence[shuffler_pb2.ClientReport],
                        token: str | None = None) -> list[shuffler_pb2.ReportAck]:
        """Submit already sealed reports (a retry reuses their idempotency ids, so it stores nothing twice)."""
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        return list(self._call(self.stub.Submit, shuffler_pb2.SubmitRequest(reports=list(chunk)), metadata).acks)
