"""Shuffler and curator as real gRPC servers on ephemeral loopback ports."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from lac_testkit import content

from lac.common import envelope
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2, shuffler_pb2_grpc

_KEY = {}


@pytest.fixture(autouse=True)
def _curator_key(curator_public_key):
    _KEY["key"] = curator_public_key


def seal(c: reports_pb2.ReportContent) -> reports_pb2.SealedPayload:
    return envelope.seal(c, _KEY["key"])


def client_report(c: reports_pb2.ReportContent, idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    return shuffler_pb2.ClientReport(idempotency_id=idem or os.urandom(16), payload=seal(c))


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_health_and_reflection(start_curator):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    cur = start_curator()
    with grpc.insecure_channel(cur.address) as ch:
        for service in ("", "lac.v1.Curator", "lac.v1.CuratorIngest"):
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        replies = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"lac.v1.Curator", "lac.v1.CuratorIngest", "grpc.health.v1.Health"} <= names


def test_submit_is_idempotent_and_validates(start_curator, start_shuffler):
    cur = start_curator()
    shf = start_shuffler(cur.address, min_batch=1000, max_report_bytes=2048)
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        reports = [client_report(content(["the", "dog"])) for _ in range(3)]
        acks = stub.Submit(shuffler_pb2.SubmitRequest(reports=reports), timeout=10).acks
        assert [a.status for a in acks] == [shuffler_pb2.ACK_STATUS_STORED] * 3
        again = stub.Submit(shuffler_pb2.SubmitRequest(reports=reports[:2]), timeout=10).acks
        assert [a.status for a in again] == [shuffler_pb2.ACK_STATUS_DUPLICATE] * 2
        streamed = stub.SubmitStream(
            iter(
                [
                    shuffler_pb2.SubmitRequest(reports=[client_report(content(["a"]))]),
                    shuffler_pb2.SubmitRequest(reports=reports[2:]),
                ]
            ),
            timeout=10,
        ).acks
        assert [a.status for a in streamed] == [shuffler_pb2.ACK_STATUS_STORED, shuffler_pb2.ACK_STATUS_DUPLICATE]

        bad = {
            "idempotency_id": shuffler_pb2.ClientReport(idempotency_id=b"x", payload=reports[0].payload),
            "exceeds 2048": shuffler_pb2.ClientReport(
                idempotency_id=os.urandom(16),
                payload=reports_pb2.SealedPayload(
                    encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=b"x" * 4096
                ),
            ),
            "unspecified": shuffler_pb2.ClientReport(
                idempotency_id=os.urandom(16), payload=reports_pb2.SealedPayload(data=b"x")
            ),
        }
        for message, report in bad.items():
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(shuffler_pb2.SubmitRequest(reports=[report]), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Submit(shuffler_pb2.SubmitRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)
        assert status.buffered_reports == 4 and sum(status.rejects.values()) == 4
        flush = stub.Flush(shuffler_pb2.FlushRequest(), timeout=10)
        assert not flush.released and "fewer than min_batch=1000" in flush.note and "4 distinct clients" in flush.note


def test_batch_reaches_curator_once_and_curator_quarantines_bad_reports(start_curator, start_shuffler):
    cur = start_curator()
    shf = start_shuffler(cur.address, min_batch=5)
    good = [content(["the", "dog", "sleeps"]) for _ in range(4)]
    broken = shuffler_pb2.ClientReport(
        idempotency_id=os.urandom(16),
        payload=reports_pb2.SealedPayload(
            encoding=envelope.HPKE, key_id=_KEY["key"].key_id, data=os.urandom(min(envelope.SEALED_SIZES))
        ),
    )
    with grpc.insecure_channel(shf.address) as sch, grpc.insecure_channel(cur.address) as cch:
        shuffler_pb2_grpc.ShufflerStub(sch).Submit(
            shuffler_pb2.SubmitRequest(reports=[client_report(c) for c in good] + [broken]), timeout=10
        )
        curator = curator_pb2_grpc.CuratorStub(cch)
        wait_for(lambda: curator.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).batches == 1)
        status = curator.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert status.reports == 4 and dict(status.rejects) == {"decrypt_failed": 1} and status.quarantined == 1
        wait_for(
            lambda: (
                shuffler_pb2_grpc.ShufflerStub(sch)
                .GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5)
                .batches_forwarded
                == 1
            )
        )

        ingest = curator_pb2_grpc.CuratorIngestStub(cch)
        request = curator_pb2.IngestBatchRequest(batch_id="b-replay", reports=[seal(good[0])])
        first = ingest.IngestBatch(request, timeout=5)
        assert (first.accepted, first.rejected, first.duplicate) == (0, 1, False)  # report id already stored
        assert ingest.IngestBatch(request, timeout=5).duplicate  # same batch id again: idempotent
        assert curator.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).rejects["replayed_report_id"] == 1
        with pytest.raises(grpc.RpcError) as err:
            ingest.IngestBatch(curator_pb2.IngestBatchRequest(batch_id=""), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_shuffler_keeps_batches_until_curator_acknowledges(start_curator, start_shuffler, tmp_path):
    import socket

    with socket.socket() as s:  # a port with nothing listening: the curator is "down"
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    shf = start_shuffler(dead, min_batch=2, forward_retry_max_seconds=0.5)
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        stub.Submit(
            shuffler_pb2.SubmitRequest(reports=[client_report(content(["a", "dog"])) for _ in range(2)]), timeout=10
        )
        time.sleep(1.0)
        status = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5)
        assert status.batches_pending == 1 and status.batches_forwarded == 0
    shf.stop()
    # Restart on the same state directory, now with a live curator: the stored batch is delivered.
    cur = start_curator()
    shf2 = start_shuffler(cur.address, min_batch=2, state_dir=tmp_path / "shuffler0")
    with grpc.insecure_channel(cur.address) as cch:
        curator = curator_pb2_grpc.CuratorStub(cch)
        wait_for(lambda: curator.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).reports == 2)
    with grpc.insecure_channel(shf2.address) as ch:
        wait_for(
            lambda: (
                shuffler_pb2_grpc.ShufflerStub(ch)
                .GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5)
                .batches_pending
                == 0
            )
        )


def test_release_and_queries(start_curator):
    cur = start_curator()
    texts = [
        ["the", "dog", "sleeps", "in", "the", "sun"],
        ["the", "fox", "is", "a", "small", "animal"],
        ["we", "walk", "the", "dog"],
        ["the", "sun", "is", "a", "star"],
    ] * 5
    with grpc.insecure_channel(cur.address) as ch:
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(batch_id="b1", reports=[seal(content(t)) for t in texts]), timeout=10
        )
        stub = curator_pb2_grpc.CuratorStub(ch)
        record = stub.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6), timeout=60)
        assert record.n_reports == 20 and record.sigma > 0 and record.mechanism == "posterior"
        assert not record.data_dependent and record.statement.startswith("(0.5, 1e-06)-differential privacy")
        assert [r.release_id for r in stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=5).releases] == [
            record.release_id
        ]
        top = stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=record.release_id, k=3, order=1), timeout=5)
        assert len(top.ngrams) == 3 and all(len(g.ngram.split()) == 1 for g in top.ngrams)
        full = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=record.release_id), timeout=5)
        assert len(full.items) == len(full.log_probs) == record.vocab_size
        with pytest.raises(grpc.RpcError) as err:
            stub.GetRelease(curator_pb2.GetReleaseRequest(release_id="nope"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        for bad in (
            curator_pb2.ReleaseRequest(epsilon=0, delta=1e-6),
            curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6, mechanism="magic"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Release(bad, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_shuffler_sees_only_sealed_shapes(start_curator, start_shuffler):
    """With plaintext refused, the shuffler accepts real HPKE payloads and rejects, with a reason
    counter and INVALID_ARGUMENT, plaintext, truncated and re-padded ones; nothing else is lost."""
    cur = start_curator()
    shf = start_shuffler(cur.address, min_batch=1000, allow_plaintext_payloads=False)
    good = seal(content(["the", "cat"]))
    bad = {
        "plaintext_refused": envelope.seal_insecure(content(["the", "cat"])),
        "bad_size": reports_pb2.SealedPayload(encoding=good.encoding, key_id=good.key_id, data=good.data[:-1]),
        "bad_key_id": reports_pb2.SealedPayload(encoding=good.encoding, key_id="k", data=good.data),
    }
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        for reason, payload in bad.items():
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(
                    shuffler_pb2.SubmitRequest(
                        reports=[
                            shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=good),
                            shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload),
                        ]
                    ),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "report 1" in err.value.details()
        acks = stub.Submit(shuffler_pb2.SubmitRequest(reports=[client_report(content(["a", "dog"]))]), timeout=10)
        status = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)
    assert [a.status for a in acks.acks] == [shuffler_pb2.ACK_STATUS_STORED]
    assert status.buffered_reports == 1  # a request with one bad report stores none of it; the client retries
    assert {k: status.rejects[k] for k in bad} == dict.fromkeys(bad, 1)
