"""Sending privatized reports to the shuffler.

Each report gets a fresh random report id (inside the sealed content, for the curator's
replay protection) and a separate random idempotency id (outside, for the shuffler):
the shuffler never sees the id the curator sees. Retrying a call reuses the same
idempotency ids, so a retry is stored once. Content is HPKE-sealed to the curator's
public key; the channel is TLS and the client authenticates with a bearer token (or
an mTLS certificate). Plaintext payloads and channels need ``insecure=True``.

Failures surface as ``lac.client.errors`` (never a raw ``grpc.RpcError``): transient ones
(UNAVAILABLE, DEADLINE_EXCEEDED) after this client's own retries as ``RetryableError``, a used-up
quota as ``QuotaExceeded``, credentials as ``AuthenticationError``, refused input as
``InvalidReportError``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from lac.common import envelope, tls
from lac.common.deployment import Deployment
from lac.common.envelope import CuratorPublicKey
from lac.common.serde import deployment_from_proto, mechanism_id
from lac.common.v1 import reports_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.client._grpc_errors import retry_after, wrap
from lac.client.presets import DEFAULT_PRESET, Preset

if TYPE_CHECKING:
    from lac.client.localizer import Localizer, PrivatizedReport

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
MAX_RETRY_WAIT = 30.0  # seconds: the longest the SDK sleeps between two attempts
TOKEN_ENV = "LAC_CLIENT_TOKEN"


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
    allows plaintext payloads and channels for local demos only. ``ShufflerClient.connect``
    builds the same from file paths.
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

    @classmethod
    def connect(cls, address: str, *, curator_key: str | os.PathLike | CuratorPublicKey | None = None,
                ca: str | os.PathLike | None = None, token: str | None = None, cert: str | os.PathLike | None = None,
                key: str | os.PathLike | None = None, insecure: bool = False, **options) -> ShufflerClient:
        """A client of the shuffler at ``address`` ("host:port") from files: ``curator_key`` (the
        curator's ``curator.pub``, or a loaded ``CuratorPublicKey``), ``ca`` (the CA that signed
        the shuffler's certificate), optionally ``cert``/``key`` for mutual TLS, and the bearer
        ``token`` (default: ``$LAC_CLIENT_TOKEN``). ``options`` go to the constructor
        (``batch_size``, ``attempts``, ``timeout``)."""
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if curator_key is not None and not isinstance(curator_key, CuratorPublicKey):
            curator_key = CuratorPublicKey.load(Path(curator_key))
        channel_tls = tls.client_tls(os.fspath(ca or ""), os.fspath(cert or ""), os.fspath(key or ""),
                                     insecure=insecure, name="ShufflerClient.connect")
        return cls(address, curator_key, channel_tls, token=token, insecure=insecure, **options)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, name: str, request, metadata=None):
        """``method(request)`` with retries of transient failures (exponential back-off, or the
        server's ``retry-after-seconds`` when it is longer, up to ``MAX_RETRY_WAIT``); a final failure
        is raised as a ``lac.client.errors.LacClientError``."""
        method = getattr(self.stub, name)
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            try:
                return method(request, timeout=self.timeout, wait_for_ready=True,
                              metadata=self.metadata if metadata is None else metadata)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or attempt == self.attempts:
                    raise wrap(exc, f"Shuffler.{name}") from None
                asked = retry_after(exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None))
                                    else ())
                time.sleep(min(max(delay, asked or 0.0), MAX_RETRY_WAIT))
                delay *= 2
        raise AssertionError("unreachable")

    def deployment(self) -> Deployment:
        """The curator's published local-privacy configuration, relayed by the shuffler."""
        return deployment_from_proto(self._call("GetDeployment", reports_pb2.DeploymentRequest()))

    def localizer(self, preset: str | Preset | None = DEFAULT_PRESET, **options) -> Localizer:
        """A Localizer for the curator's current deployment: ``Localizer.for_deployment(self.deployment(),
        preset, **options)`` (ε = the smaller of the deployment's and the preset's)."""
        from lac.client.localizer import Localizer

        return Localizer.for_deployment(self.deployment(), preset, **options)

    def submit(self, reports: Iterable[PrivatizedReport] | PrivatizedReport,
               token: str | None = None) -> list[shuffler_pb2.ReportAck]:
        """Submit ``reports`` (or one report); returns one ack per report (STORED or DUPLICATE).

        ``token`` overrides this client's token for this call (e.g. a simulation playing many clients).
        """
        if hasattr(reports, "sentences"):  # a single PrivatizedReport
            reports = [reports]
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
        return list(self._call("Submit", shuffler_pb2.SubmitRequest(reports=list(chunk)), metadata).acks)
