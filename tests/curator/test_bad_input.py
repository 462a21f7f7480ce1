"""Malformed and out-of-range input to every curator RPC: a precise status (INVALID_ARGUMENT, or the
README's status for the case) and one log line, never UNKNOWN or INTERNAL, never a traceback; and
the caller's certificate is checked before any request byte is parsed."""

from __future__ import annotations

import logging
import os

import grpc
import pytest
from lac_testkit import batch_privacy, content

from lac.common import envelope, tls
from lac.common.rpc import count_field
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
R = curator_pb2.ReleaseRequest


def _raw(channel, method: str):
    service = "CuratorIngest" if method == "IngestBatch" else "Curator"
    if method == "ExportArpa":
        call = channel.unary_stream(f"/lac.v1.{service}/{method}", request_serializer=None, response_deserializer=None)
        return lambda raw, **kw: list(call(raw, **kw))
    return channel.unary_unary(f"/lac.v1.{service}/{method}", request_serializer=None, response_deserializer=None)


def _code(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture
def curator(start_curator):
    cur = start_curator(allow_plaintext_payloads=True, max_reports_per_batch=100)
    with grpc.insecure_channel(cur.address) as ch:
        n = 30
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="good",
                reports=[envelope.seal_insecure(content(["the", "dog", "sleeps"])) for _ in range(n)],
                privacy=batch_privacy(n),
            ),
            timeout=30,
        )
        rid = curator_pb2_grpc.CuratorStub(ch).Release(R(epsilon=1, delta=1e-6), timeout=60).release_id
    return cur, rid


def _bad_calls(ch, rid: str) -> dict[str, tuple]:
    """Name -> (call, expected status, words the details must hold)."""
    q, i = curator_pb2_grpc.CuratorStub(ch), curator_pb2_grpc.CuratorIngestStub(ch)

    def release(**kw):
        return lambda: q.Release(R(**kw), timeout=60)

    def preview(**kw):
        return lambda: q.PreviewRelease(R(**kw), timeout=60)

    w = batch_privacy(1).last_window
    one = [envelope.seal_insecure(content(["a"]))]
    return {
        "epsilon 5e-324": (release(epsilon=5e-324, delta=1e-6), INVALID, "epsilon"),
        "epsilon 5e-324 laplace forced": (release(epsilon=5e-324, mechanism="laplace", force=True), INVALID, "epsilon"),
        "epsilon inf": (release(epsilon=float("inf")), INVALID, "epsilon"),
        "epsilon nan": (release(epsilon=float("nan")), INVALID, "epsilon"),
        "epsilon negative": (release(epsilon=-1.0), INVALID, "epsilon"),
        "epsilon unset": (release(), INVALID, "epsilon"),
        "epsilon 1e308": (release(epsilon=1e308), INVALID, "epsilon"),
        "delta 5e-324": (release(epsilon=1, delta=5e-324), INVALID, "delta"),
        "delta 1": (release(epsilon=1, delta=1.0), INVALID, "delta"),
        "delta nan": (release(epsilon=1, delta=float("nan"), mechanism="bayesian"), INVALID, "delta"),
        "S nan": (release(epsilon=1, mechanism="bayesian", s=float("nan")), INVALID, "S must"),
        "S negative": (release(epsilon=1, mechanism="bayesian", s=-3.0), INVALID, "S must"),
        "rho 7": (release(epsilon=1, mechanism="endtoend", rho=7.0), INVALID, "rho"),
        "rho nan": (release(epsilon=1, mechanism="endtoend", rho=float("nan")), INVALID, "rho"),
        "unknown mechanism": (release(epsilon=1, mechanism="nope"), INVALID, "mechanism"),
        "kanon over RPC": (release(epsilon=1, mechanism="kanon"), INVALID, "mechanism"),
        "window order": (release(epsilon=1, first_window=5, last_window=4), INVALID, "window"),
        "future window": (release(epsilon=1, first_window=w, last_window=w + 10), INVALID, "current window"),
        "one window bound": (release(epsilon=1, first_window=5), INVALID, "window"),
        "2^64 windows": (release(epsilon=1, first_window=-(2**63), last_window=2**63 - 1), INVALID, "windows"),
        "expected_reports negative": (release(epsilon=1, expected_reports=-5), INVALID, "expected_reports"),
        "request id too long": (release(epsilon=1, request_id="x" * 129), INVALID, "request_id"),
        "request id control": (release(epsilon=1, request_id="a\nb"), INVALID, "request_id"),
        "preview epsilon 5e-324": (preview(epsilon=5e-324), INVALID, "epsilon"),
        "preview delta 5e-324": (preview(epsilon=1, delta=5e-324), INVALID, "delta"),
        "top order 2^32-1": (
            lambda: q.TopNgrams(curator_pb2.TopNgramsRequest(release_id=rid, order=2**32 - 1), timeout=10),
            INVALID,
            "order",
        ),
        "top unknown release": (
            lambda: q.TopNgrams(curator_pb2.TopNgramsRequest(release_id="x" * 10_000), timeout=10),
            grpc.StatusCode.NOT_FOUND,
            "no release",
        ),
        "get empty id": (
            lambda: q.GetRelease(curator_pb2.GetReleaseRequest(), timeout=10),
            grpc.StatusCode.NOT_FOUND,
            "no release",
        ),
        "get path": (
            lambda: q.GetRelease(curator_pb2.GetReleaseRequest(release_id="../curator"), timeout=10),
            grpc.StatusCode.NOT_FOUND,
            "no release",
        ),
        "prob none": (
            lambda: q.NgramProbabilities(curator_pb2.NgramProbabilitiesRequest(release_id=rid), timeout=10),
            INVALID,
            "n-gram",
        ),
        "prob empty n-gram": (
            lambda: q.NgramProbabilities(
                curator_pb2.NgramProbabilitiesRequest(release_id=rid, ngrams=[""]), timeout=10
            ),
            INVALID,
            "n-gram",
        ),
        "prob too many": (
            lambda: q.NgramProbabilities(
                curator_pb2.NgramProbabilitiesRequest(release_id=rid, ngrams=["the"] * 10_001), timeout=10
            ),
            INVALID,
            "at most",
        ),
        "next context huge": (
            lambda: q.NextWord(curator_pb2.NextWordRequest(release_id=rid, context="a " * 10_000), timeout=10),
            INVALID,
            "context",
        ),
        "perplexity no words": (
            lambda: q.Perplexity(curator_pb2.PerplexityRequest(release_id=rid, text="..."), timeout=10),
            INVALID,
            "no words",
        ),
        "perplexity huge": (
            lambda: q.Perplexity(curator_pb2.PerplexityRequest(release_id=rid, text="a" * 1_000_001), timeout=10),
            INVALID,
            "at most",
        ),
        "arpa unknown": (
            lambda: list(q.ExportArpa(curator_pb2.ExportArpaRequest(release_id="nope"), timeout=10)),
            grpc.StatusCode.NOT_FOUND,
            "no release",
        ),
        "ingest no id": (
            lambda: i.IngestBatch(curator_pb2.IngestBatchRequest(reports=one), timeout=10),
            INVALID,
            "batch_id",
        ),
        "ingest long id": (
            lambda: i.IngestBatch(curator_pb2.IngestBatchRequest(batch_id="b" * 129, reports=one), timeout=10),
            INVALID,
            "batch_id",
        ),
        "ingest future window": (
            lambda: i.IngestBatch(
                curator_pb2.IngestBatchRequest(batch_id="f", reports=one, privacy=batch_privacy(1, window=2**62)),
                timeout=10,
            ),
            INVALID,
            "windows",
        ),
        "ingest negative window": (
            lambda: i.IngestBatch(
                curator_pb2.IngestBatchRequest(batch_id="n", reports=one, privacy=batch_privacy(1, window=-1)),
                timeout=10,
            ),
            INVALID,
            "windows",
        ),
        "ingest window order": (
            lambda: i.IngestBatch(
                curator_pb2.IngestBatchRequest(
                    batch_id="o",
                    reports=one,
                    privacy=reports_pb2.BatchPrivacy(
                        n_reports=1,
                        distinct_clients=True,
                        reports_per_window=1,
                        window_seconds=86400.0,
                        first_window=w,
                        last_window=w - 1,
                    ),
                ),
                timeout=10,
            ),
            INVALID,
            "windows",
        ),
        "ingest 101 reports": (
            lambda: i.IngestBatch(
                curator_pb2.IngestBatchRequest(batch_id="many", reports=one * 101, privacy=batch_privacy(101)),
                timeout=10,
            ),
            INVALID,
            "at most 100",
        ),
        "ingest 40,000 empty reports": (
            lambda: _raw(ch, "IngestBatch")(
                curator_pb2.IngestBatchRequest(batch_id="bomb").SerializeToString() + b"\x12\x00" * 40_000, timeout=10
            ),
            INVALID,
            "more than 100 reports",
        ),
        "ingest quota mismatch": (
            lambda: i.IngestBatch(
                curator_pb2.IngestBatchRequest(
                    batch_id="q",
                    reports=one,
                    privacy=reports_pb2.BatchPrivacy(
                        n_reports=1,
                        distinct_clients=True,
                        reports_per_window=7,
                        window_seconds=86400.0,
                        first_window=w,
                        last_window=w,
                    ),
                ),
                timeout=10,
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "quota",
        ),
    }


def test_out_of_range_input_gets_a_precise_status_and_one_log_line(curator, caplog):
    cur, rid = curator
    with grpc.insecure_channel(cur.address, options=[("grpc.max_send_message_length", 64 * 1024**2)]) as ch:
        for name, (call, want, words) in _bad_calls(ch, rid).items():
            caplog.clear()
            with caplog.at_level(logging.INFO):
                code, details = _code(call)
            assert code == want, (name, code, details)
            assert words in details, (name, details)
            boundary = [r for r in caplog.records if r.name == "lac.common.rpc"]
            assert len(boundary) == 1 and want.name in boundary[0].getMessage(), (name, caplog.text)
            assert not any(r.exc_info for r in caplog.records), (name, caplog.text)
        status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)
    assert (status.batches, status.releases) == (1, 1)  # nothing of it was stored or released


def test_malformed_bytes_to_every_rpc_are_invalid_argument(curator, caplog):
    cur, _ = curator
    methods = [m.name for s in ("CuratorIngest", "Curator") for m in curator_pb2.DESCRIPTOR.services_by_name[s].methods]
    garbage = [
        b"\xff",
        b"\x0a\xff\xff\xff\xff\x0f",
        b"\x08" + b"\x80" * 11,
        b"\x7b\x00" * 3,
        b"\x0a\x03ab",
        bytes(range(256)),
    ]
    with grpc.insecure_channel(cur.address) as ch, caplog.at_level(logging.INFO):
        for method in methods:
            for raw in garbage:
                code, details = _code(lambda method=method, raw=raw: _raw(ch, method)(raw, timeout=10))
                assert code == INVALID, (method, raw, code, details)
                assert "malformed" in details
    assert not any(r.exc_info for r in caplog.records), caplog.text


def test_the_certificate_is_checked_before_the_request_is_parsed(start_curator, pki, caplog):
    """An IngestBatch of malformed bytes, or of more reports than the limit, from a certificate without
    the ingest role is PERMISSION_DENIED (the bytes are never parsed or scanned); from the shuffler's
    certificate it is INVALID_ARGUMENT."""
    tls.issue(pki.root, "intruder", ["localhost", "127.0.0.1"])  # signed by the CA, in no role
    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, max_reports_per_batch=10)
    bomb = b"\x0a\x01b" + b"\x12\x00" * 100_000
    assert count_field(bomb, 2, 10) == 11
    for who, want in (
        ("intruder", grpc.StatusCode.PERMISSION_DENIED),
        ("analyst", grpc.StatusCode.PERMISSION_DENIED),
        ("operator", grpc.StatusCode.PERMISSION_DENIED),
        ("shuffler", INVALID),
    ):
        with tls.channel(cur.address, pki.client_tls(who)) as ch, caplog.at_level(logging.INFO):
            for raw in (b"\xff\xff\xff", b"\x0a\x05ab", bomb, os.urandom(5000)):
                caplog.clear()
                code, details = _code(lambda raw=raw: _raw(ch, "IngestBatch")(raw, timeout=10))
                assert code == want, (who, raw[:10], code, details)
                assert not any(r.exc_info for r in caplog.records), caplog.text


def test_a_message_over_max_message_bytes_is_refused_by_grpc_before_it_is_read(start_curator):
    cur = start_curator(allow_plaintext_payloads=True, max_message_bytes=256 * 1024)
    big = curator_pb2.IngestBatchRequest(
        batch_id="big",
        privacy=batch_privacy(1),
        reports=[envelope.seal_insecure(content(["w" * 60] * 40)) for _ in range(150)],
    )
    assert big.ByteSize() > 256 * 1024
    with grpc.insecure_channel(cur.address) as ch:
        ingest = curator_pb2_grpc.CuratorIngestStub(ch)
        code, _ = _code(lambda: ingest.IngestBatch(big, timeout=10))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        del big.reports[40:]
        assert ingest.IngestBatch(big, timeout=10).accepted == 40  # under the limit: served


def test_curator_connections_beyond_max_connections_are_closed_at_once(start_curator):
    """Issue 23.6 for the curator: beyond max_connections a new connection is closed as soon as it is
    accepted (UNAVAILABLE at once, not a handshake that times out), and once one closes another is taken."""
    import time

    from lac_testkit import DEADLINE, PROMPT, wait_until

    cur = start_curator(max_connections=3)
    own = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel

    def deployment(ch, timeout=5):
        return curator_pb2_grpc.CuratorStub(ch).GetDeployment(reports_pb2.DeploymentRequest(), timeout=timeout)

    channels = [grpc.insecure_channel(cur.address, options=own) for _ in range(4)]
    try:
        for ch in channels[:3]:
            deployment(ch)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            deployment(channels[3], timeout=DEADLINE)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t0 < PROMPT
        channels[0].close()

        def connects() -> bool:
            with grpc.insecure_channel(cur.address, options=own) as ch:
                try:
                    deployment(ch, timeout=2)
                except grpc.RpcError:
                    return False
            return True

        wait_until(connects)
    finally:
        for ch in channels:
            ch.close()
