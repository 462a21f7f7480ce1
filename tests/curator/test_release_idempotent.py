"""Idempotent, atomic releases: a request id makes a retried release return the release made the
first time and spend once; a release's file and its ledger entries exist together or not at all."""

from __future__ import annotations

import json
import threading

import grpc
import pytest
from lac_testkit import batch_privacy, content

from lac.analyst.client import CuratorClient, release_with_retries
from lac.common import envelope
from lac.common.v1 import curator_pb2, curator_pb2_grpc

R = curator_pb2.ReleaseRequest


@pytest.fixture
def curator(start_curator):
    cur = start_curator(allow_plaintext_payloads=True, budget_epsilon=5.0)
    with grpc.insecure_channel(cur.address) as ch:
        n = 40
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="b1",
                reports=[
                    envelope.seal_insecure(content(["the", "dog", "sleeps", "in", "the", "sun"])) for _ in range(n)
                ],
                privacy=batch_privacy(n),
            ),
            timeout=30,
        )
    return cur


def _spent(stub) -> float:
    return sum(w.spent_epsilon for w in stub.GetBudget(curator_pb2.BudgetRequest(), timeout=10).windows)


def _releases(stub) -> list[str]:
    return [r.release_id for r in stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=10).releases]


def test_a_retry_with_the_same_request_id_returns_the_same_release_and_spends_once(curator):
    with grpc.insecure_channel(curator.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        first = stub.Release(R(epsilon=1.0, delta=1e-6, request_id="job-42"), timeout=60)
        again = stub.Release(R(epsilon=1.0, delta=1e-6, request_id="job-42"), timeout=60)
        assert again == first and first.request_id == "job-42"
        assert _spent(stub) == pytest.approx(1.0) and _releases(stub) == [first.release_id]
        with pytest.raises(grpc.RpcError) as err:  # the same id for another release
            stub.Release(R(epsilon=2.0, delta=1e-6, request_id="job-42"), timeout=60)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "other parameters" in err.value.details()
        assert _spent(stub) == pytest.approx(1.0)
        no_id = [stub.Release(R(epsilon=0.5, delta=1e-6), timeout=60) for _ in range(2)]  # unset: fresh ids
        assert no_id[0].release_id != no_id[1].release_id and no_id[0].request_id != no_id[1].request_id
        assert _spent(stub) == pytest.approx(2.0)


def test_concurrent_calls_with_one_request_id_make_one_release(curator):
    with grpc.insecure_channel(curator.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        got: list = []
        threads = [
            threading.Thread(
                target=lambda: got.append(
                    stub.Release(R(epsilon=1.0, delta=1e-6, request_id="same"), timeout=60).release_id
                )
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(got) == 8 and len(set(got)) == 1
        assert _releases(stub) == got[:1] and _spent(stub) == pytest.approx(1.0)


def test_a_release_whose_reply_is_lost_is_returned_by_the_retry(curator):
    """A reply lost on the way (the call answered DEADLINE_EXCEEDED or UNAVAILABLE after the curator
    made the release) and a call whose deadline expires at once: the retry with the same id returns
    the one release, spent once."""

    class Lost(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self):
            return "reply lost"

        def trailing_metadata(self):
            return ()

    with grpc.insecure_channel(curator.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        calls = []

        def lossy(request, timeout):
            reply = stub.Release(request, timeout=timeout)
            calls.append(reply.release_id)
            if len(calls) == 1:
                raise Lost()
            return reply

        record = release_with_retries(lossy, R(epsilon=1.0, delta=1e-6, request_id="lost-1"), 60, sleep=lambda s: None)
        assert calls == [record.release_id] * 2 and _spent(stub) == pytest.approx(1.0)

        req = R(epsilon=0.5, delta=1e-6, request_id="hurried")
        with pytest.raises(grpc.RpcError) as err:
            stub.Release(req, timeout=0.001)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        record2 = stub.Release(req, timeout=60)  # whether or not the first attempt ran: one release
        assert sorted(_releases(stub)) == sorted([record.release_id, record2.release_id])
        assert _spent(stub) == pytest.approx(1.5)

    with CuratorClient(curator.address, insecure=True) as client:  # the analyst API sends and reuses an id
        info = client.release(epsilon=0.25, delta=1e-6, request_id="api-1")
        assert info.request_id == "api-1" and client.release(0.25, 1e-6, request_id="api-1") == info
        assert client.release(0.25, 1e-6).request_id not in ("", "api-1")


def test_cli_release_is_idempotent_by_request_id(curator, capsys):
    from lac.common.cli import main

    def run(*argv):
        with pytest.raises(SystemExit) as e:
            main(list(argv))
        assert e.value.code == 0
        return json.loads(capsys.readouterr().out)

    srv = ("--server", curator.address, "--insecure", "--json")
    a = run("curator", "release", *srv, "--epsilon", "1", "--delta", "1e-6", "--request-id", "cli-7")
    b = run("curator", "release", *srv, "--epsilon", "1", "--delta", "1e-6", "--request-id", "cli-7")
    assert a == b and a["request_id"] == "cli-7"
    c = run("curator", "release", *srv, "--epsilon", "1", "--delta", "1e-6")
    assert c["release_id"] != a["release_id"] and len(c["request_id"]) == 32
