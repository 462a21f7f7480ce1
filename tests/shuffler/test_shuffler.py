"""The shuffler as a real gRPC server: group commit, authentication, quotas, anonymisation on
the wire, crowd threshold, sub-sampling, backpressure, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
import urllib.request

import grpc
import pytest
from lac_testkit import ServeProc, wait_until
from shuffler_testkit import payload, report, tag_of, wait_for

from lac.common.deployment import Deployment
from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_client


def _submit(address, reports, token=None, timeout=10):
    md = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as ch:
        return (
            shuffler_pb2_grpc.ShufflerStub(ch)
            .Submit(shuffler_pb2.SubmitRequest(reports=reports), metadata=md, timeout=timeout)
            .acks
        )


def _status(address):
    with grpc.insecure_channel(address) as ch:
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)


def test_concurrent_submits_share_commits(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=10_000)

    async def main():
        async with grpc.aio.insecure_channel(shf.address) as ch:
            stub = shuffler_pb2_grpc.ShufflerStub(ch)
            calls = [
                stub.Submit(shuffler_pb2.SubmitRequest(reports=[report() for _ in range(10)]), timeout=30)
                for _ in range(200)
            ]
            return await asyncio.gather(*calls)

    replies = asyncio.run(main())
    assert all(a.status == shuffler_pb2.ACK_STATUS_STORED for r in replies for a in r.acks)
    status = _status(shf.address)
    assert status.buffered_reports == 2000 and status.counters["accepted"] == 2000
    commits = shf.call(_commits(shf))
    assert commits < 200, f"{commits} commits for 200 concurrent calls: no group commit"


async def _commits(shf):
    return shf_shuffler(shf).reportlog.commits


def shf_shuffler(shf):
    return shf.shuffler  # its ShufflerState


def test_client_stream_and_idempotency(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000)
    first = [report() for _ in range(3)]
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        acks = stub.SubmitStream(
            iter([shuffler_pb2.SubmitRequest(reports=first[:2]), shuffler_pb2.SubmitRequest(reports=first)]), timeout=10
        ).acks
    assert [a.status for a in acks] == [shuffler_pb2.ACK_STATUS_STORED] * 2 + [
        shuffler_pb2.ACK_STATUS_DUPLICATE
    ] * 2 + [shuffler_pb2.ACK_STATUS_STORED]
    assert _status(shf.address).counters["duplicates"] == 2


def test_authentication_and_quota(start_shuffler, sink, tmp_path):
    state = tmp_path / "auth-shuffler"
    alice = add_client(state / "clients.tokens", "alice")
    sink.deployment = Deployment(reports_per_window=2)  # the curator's privacy unit, as the shuffler's quota
    shf = start_shuffler(sink.address, auth="token", state_dir=state, reports_per_window=2, min_batch=1000)
    for token in (None, "not-a-token"):
        with pytest.raises(grpc.RpcError) as err:
            _submit(shf.address, [report()], token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    two = [report(), report()]
    assert [a.status for a in _submit(shf.address, two, alice)] == [shuffler_pb2.ACK_STATUS_STORED] * 2
    assert [a.status for a in _submit(shf.address, two, alice)] == [shuffler_pb2.ACK_STATUS_DUPLICATE] * 2
    with pytest.raises(grpc.RpcError) as err:
        _submit(shf.address, [report()], alice)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry after" in err.value.details()
    retry = dict(err.value.trailing_metadata())["retry-after-seconds"]
    assert 1 <= int(retry) <= 86400
    # A client added while the shuffler runs has its own quota; a request over quota stores nothing.
    bob = add_client(state / "clients.tokens", "bob")
    with pytest.raises(grpc.RpcError) as err:
        _submit(shf.address, [report() for _ in range(3)], bob)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(_submit(shf.address, [report()], bob)) == 1
    status = _status(shf.address)
    assert status.buffered_reports == 3 and status.rejects["quota"] == 4 and status.auth == "token"
    # The client ids are stored nowhere (the quota table keys are keyed hashes); tokens only as hashes.
    shf.stop()
    raw = b"".join(p.read_bytes() for p in state.iterdir() if p.name.startswith("shuffler.sqlite"))
    assert b"alice" not in raw and b"bob" not in raw and alice.encode() not in raw
    assert alice not in (state / "clients.tokens").read_text()
    rows = sqlite3.connect(state / "shuffler.sqlite").execute("SELECT COUNT(*) FROM window_quota").fetchone()[0]
    assert rows == 2


def test_invalid_and_oversized_input(start_shuffler, sink):
    shf = start_shuffler(sink.address, max_report_bytes=2048, max_reports_per_request=5)
    plain = reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE
    bad = {
        "idempotency_id": shuffler_pb2.ClientReport(idempotency_id=b"x", payload=payload(b"t")),
        "exceeds 2048": shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16), payload=reports_pb2.SealedPayload(encoding=plain, data=b"x" * 4096)
        ),
        "unspecified": shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16), payload=reports_pb2.SealedPayload(data=b"x")
        ),
        "empty payload": shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16), payload=reports_pb2.SealedPayload(encoding=plain)
        ),
        "longer than": report(crowd="c" * 1000),
    }
    for message, r in bad.items():
        with pytest.raises(grpc.RpcError) as err:
            _submit(shf.address, [report(), r])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
    for reports in ([], [report() for _ in range(6)]):
        with pytest.raises(grpc.RpcError) as err:
            _submit(shf.address, reports)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with grpc.insecure_channel(shf.address) as ch:  # bytes that are not a SubmitRequest at all
        raw = ch.unary_unary("/lac.v1.Shuffler/Submit", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff garbage", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()
    status = _status(shf.address)
    assert status.buffered_reports == 0 and sum(status.rejects.values()) == 8 and status.rejects["malformed"] == 1


def test_wire_carries_no_identity_time_or_order(start_shuffler, sink, tmp_path):
    state = tmp_path / "wire-shuffler"
    tokens = [add_client(state / "clients.tokens", f"client-identity-{i}") for i in range(60)]
    shf = start_shuffler(sink.address, auth="token", state_dir=state, min_batch=60)
    # Unknown fields smuggled into the payload must not reach the curator.
    smuggled = reports_pb2.SealedPayload.FromString(
        payload(b"smuggled-report-1").SerializeToString() + b"\xf8\x07\x2a"
    )  # field 127 = 42
    sent = [report(tag=i.to_bytes(16, "big"), crowd="crowd-secret") for i in range(59)]
    sent.append(shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=smuggled, crowd_id="crowd-secret"))
    for r, token in zip(sent, tokens):  # 60 clients, one report each
        _submit(shf.address, [r], token)
    wait_for(lambda: len(sink.raw) >= 1)
    wait_for(lambda: _status(shf.address).batches_forwarded == 1)
    raw = sink.raw[0]
    batch = curator_pb2.IngestBatchRequest.FromString(raw)
    allowed = {"batch_id", "reports", "privacy"}
    assert {f.name for f, _ in batch.ListFields()} <= allowed
    for p in batch.reports:  # nothing but the payload's known fields
        clean = reports_pb2.SealedPayload(encoding=p.encoding, key_id=p.key_id, data=p.data)
        assert p.SerializeToString() == clean.SerializeToString()
    stripped = curator_pb2.IngestBatchRequest(batch_id=batch.batch_id, reports=batch.reports)
    if "privacy" in curator_pb2.IngestBatchRequest.DESCRIPTOR.fields_by_name:
        stripped.privacy.CopyFrom(batch.privacy)
    assert raw == stripped.SerializeToString()  # no unknown fields anywhere
    for secret in [r.idempotency_id for r in sent] + [b"crowd-secret", b"client-identity", tokens[0].encode()]:
        assert secret not in raw
    tags = [tag_of(p) for p in batch.reports]
    submitted = [tag_of(r.payload) for r in sent]
    assert sorted(tags) == sorted(submitted) and tags != submitted  # same reports, not in arrival order
    status = _status(shf.address)
    privacy = status.recent_batches[0].privacy
    assert privacy.n_reports == 60 and privacy.distinct_clients and privacy == batch.privacy
    # ε0 comes from the curator's published deployment, never from the shuffler's own configuration
    assert privacy.report_epsilon0 == pytest.approx(sink.deployment.report_epsilon0)
    assert "No amplification" in privacy.statement and privacy.central_epsilon == privacy.report_epsilon0


def test_crowd_threshold_and_subsampling(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=10, crowd_threshold=3)
    reports = (
        [report(crowd="a") for _ in range(6)] + [report(crowd="b") for _ in range(2)] + [report() for _ in range(2)]
    )
    _submit(shf.address, reports)
    wait_for(lambda: _status(shf.address).batches_forwarded == 1)
    assert sorted(sink.tags()) == sorted(tag_of(r.payload) for r in reports[:6])
    status = _status(shf.address)
    assert status.counters["dropped_crowd_threshold"] == 4 and "crowd threshold" in status.note

    shf2 = start_shuffler(sink.address, min_batch=400, subsample_q=0.5)
    _submit(shf2.address, [report() for _ in range(400)])
    wait_for(lambda: _status(shf2.address).batches_forwarded == 1)
    kept = _status(shf2.address).reports_forwarded
    assert abs(kept - 200) < 60  # Binomial(400, 1/2): sd 10, 6 sd
    assert _status(shf2.address).counters["dropped_subsampled"] == 400 - kept


def test_keep_reserve_streams_batches_and_the_flush_releases_the_rest(start_shuffler, sink):
    """keep_reserve: a release after a commit keeps min_batch reports back (it waits for 2 x min_batch);
    the operator's Flush (as the interval's end) releases them with the stragglers; no batch is below min_batch."""
    shf = start_shuffler(sink.address, min_batch=10, keep_reserve=True)
    first = [report() for _ in range(25)]
    _submit(shf.address, first)
    wait_for(lambda: _status(shf.address).batches_forwarded == 1)
    status = _status(shf.address)
    assert status.reports_forwarded == 15 and "kept back" in status.note
    assert len(set(sink.tags()) & {tag_of(r.payload) for r in first}) == 15
    _submit(shf.address, [report() for _ in range(5)])  # 15 buffered: under 2 x min_batch, nothing released
    time.sleep(0.3)
    assert _status(shf.address).batches_forwarded == 1
    with grpc.insecure_channel(shf.address) as ch:
        flushed = shuffler_pb2_grpc.ShufflerStub(ch).Flush(shuffler_pb2.FlushRequest(), timeout=10)
    assert flushed.released and flushed.batch_size == 15
    wait_for(lambda: _status(shf.address).batches_forwarded == 2)
    assert sorted(b.privacy.n_reports for b in _status(shf.address).recent_batches) == [15, 15]
    assert len(sink.tags()) == 30

    plain = start_shuffler(sink.address, min_batch=10)  # without the reserve a release takes every buffered report
    _submit(plain.address, [report() for _ in range(25)])
    wait_for(lambda: _status(plain.address).batches_forwarded == 1)
    assert _status(plain.address).reports_forwarded == 25


def test_backpressure_when_curator_is_down(start_shuffler, sink):
    sink.down = True
    shf = start_shuffler(sink.address, min_batch=5, max_log_bytes=250_000, forward_retry_max_seconds=0.2)
    accepted = 0
    with pytest.raises(grpc.RpcError) as err:
        for _ in range(200):
            _submit(
                shf.address,
                [
                    shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload(os.urandom(16), 4000))
                    for _ in range(5)
                ],
            )
            accepted += 5
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "report log full" in err.value.details()
    assert 20 <= accepted < 1000
    status = _status(shf.address)
    assert status.batches_pending >= 1 and status.rejects["log_full"] >= 5
    sink.down = False  # the curator comes back: the backlog drains and ingest resumes
    wait_for(lambda: _status(shf.address).batches_pending == 0)
    assert len(_submit(shf.address, [report() for _ in range(5)])) == 5
    wait_for(lambda: len(sink.tags()) == accepted + 5)


def test_metrics_endpoint(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=3, metrics_port=0)
    _submit(shf.address, [report() for _ in range(3)])
    wait_for(lambda: _status(shf.address).batches_forwarded == 1)
    port = shf.call(_metrics_port(shf))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "lac_shuffler_reports_accepted_total 3" in text
    assert "lac_shuffler_reports_forwarded_total 3" in text
    assert 'lac_shuffler_ingest_seconds_bucket{le="+Inf"} 1' in text
    assert "# TYPE lac_shuffler_rejects_total counter" in text


async def _metrics_port(shf):
    return await shf_shuffler(shf).metrics_ready


def test_a_refused_call_is_logged_by_role_never_by_client_id(start_shuffler, pki, tmp_path, caplog):
    """A client's token calling an operator RPC on a TLS shuffler: PERMISSION_DENIED, said and
    logged by role and method, never with the client's id."""
    from lac.common import tls

    state = tmp_path / "state"
    token = add_client(state / "clients.tokens", "alice-7f3c")
    cert, key = pki.pem("shuffler")
    shf = start_shuffler(
        "127.0.0.1:1", insecure=False, auth="token", state_dir=state, tls_cert=cert, tls_key=key, curator_ca=pki.ca
    )
    with (
        caplog.at_level(logging.INFO),
        tls.channel(shf.address, pki.client_tls()) as ch,
        pytest.raises(grpc.RpcError) as err,
    ):
        shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(
            shuffler_pb2.ShufflerStatusRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details() == "role client may not call GetStatus (allowed roles: operator)"
    assert "PERMISSION_DENIED: role client may not call GetStatus" in caplog.text
    assert "alice-7f3c" not in caplog.text


def test_served_shuffler_warns_of_metrics_beyond_loopback(tmp_path):
    """A real ``lac shuffler serve --metrics-host 0.0.0.0`` starts with one loud warning (the
    metrics are exact counts); on 127.0.0.1, the default, without one."""
    common = ["--state-dir", str(tmp_path / "state"), "--curator", "127.0.0.1:1", "--insecure", "--auth", "none"]
    for host, workdir in (("0.0.0.0", "exposed"), ("127.0.0.1", "loopback")):
        shf = ServeProc([*common, "--metrics-host", host, "--metrics-port", "0"], tmp_path / workdir)
        try:
            wait_until(lambda: "metrics on http://" in shf.log_text())
        finally:
            shf.stop()
        warned = [line for line in shf.log_text().splitlines() if "METRICS EXPOSED BEYOND LOOPBACK" in line]
        if host == "0.0.0.0":
            assert len(warned) == 1 and " WARNING " in warned[0] and "listens on every interface" in warned[0]
        else:
            assert warned == []


def test_large_release_is_cut_into_batches_that_fit_a_message(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=10, max_batch_bytes=20_000)  # ~19 reports a batch, none below 10
    reports = [
        shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload(os.urandom(16), 1000))
        for _ in range(50)
    ]
    _submit(shf.address, reports)
    wait_for(lambda: _status(shf.address).reports_forwarded == 50)
    assert max(len(r) for r in sink.raw) <= 20_000 + 100 and len(sink.batches()) >= 3
    assert min(len(b.reports) for b in sink.batches().values()) >= 10
    assert sorted(sink.tags()) == sorted(tag_of(r.payload) for r in reports)


def test_a_log_written_before_the_numbered_schema_steps_is_brought_to_them_as_it_was(tmp_path):
    """A report log as the shuffler wrote it before its schema became numbered steps (issue 34's layout: period_use,
    dead letters, the client key's id beside client.key; no schema_version) gets every step recorded and keeps each
    row: its buffered reports, its dead letter, its clients' period use under the same hashes."""
    import numpy as np

    from lac.shuffler import wire
    from lac.shuffler.reportlog import OVER_PERIOD_CAP, ReportLog, key_id, write_key

    key = os.urandom(32)
    write_key(tmp_path / "client.key", key)
    db = sqlite3.connect(tmp_path / "shuffler.sqlite")
    db.executescript(
        """
        CREATE TABLE buffer (seq INTEGER PRIMARY KEY, crowd TEXT, payload BLOB NOT NULL, client BLOB,
                             win INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE seen (idempotency_id BLOB PRIMARY KEY) WITHOUT ROWID;
        CREATE TABLE seen_prev (idempotency_id BLOB PRIMARY KEY) WITHOUT ROWID;
        CREATE TABLE batches (batch_id TEXT PRIMARY KEY, n INTEGER NOT NULL, seqs BLOB, release_id TEXT NOT NULL,
                              privacy BLOB, delivered INTEGER NOT NULL DEFAULT 0,
                              first_window INTEGER NOT NULL DEFAULT 0, last_window INTEGER NOT NULL DEFAULT 0,
                              distinct_clients INTEGER NOT NULL DEFAULT 0, dead TEXT, dead_at REAL);
        CREATE TABLE window_quota (win INTEGER NOT NULL, client BLOB NOT NULL, n INTEGER NOT NULL,
                                   PRIMARY KEY (win, client)) WITHOUT ROWID;
        CREATE TABLE period_use (period INTEGER NOT NULL, client BLOB NOT NULL, windows INTEGER NOT NULL,
                                 last_window INTEGER NOT NULL, PRIMARY KEY (period, client)) WITHOUT ROWID;
        CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
        CREATE TABLE meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
        """
    )
    log = ReportLog.__new__(ReportLog)  # only for its hash of a client id with this key
    log._client_key = key
    alice, bob = log.client_key("token:alice"), log.client_key("token:bob")
    db.executemany(
        "INSERT INTO buffer (seq, payload, client, win) VALUES (?, ?, ?, 7)",
        [(1, wire.batch_entry(b"a"), alice), (2, wire.batch_entry(b"b"), bob), (3, wire.batch_entry(b"c"), alice)],
    )
    db.execute(
        "INSERT INTO batches (batch_id, n, seqs, release_id, first_window, last_window, distinct_clients, dead, "
        "dead_at) VALUES ('b1', 2, ?, 'b1', 7, 7, 1, 'INVALID_ARGUMENT: refused', 1.5)",
        (np.asarray([2, 1], dtype="<i8").tobytes(),),
    )
    db.execute("INSERT INTO period_use VALUES (0, ?, 2, 7)", (alice,))
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("seen_since", b"1.0"), ("client_key_id", key_id(key))])
    db.commit()
    db.close()

    log = ReportLog(tmp_path)
    try:
        versions = [v for (v,) in log.database.execute("SELECT version FROM schema_version ORDER BY version")]
        assert versions == [1, 2, 3] and "period_windows" not in log.database.tables()
        assert log.dead_letters() == [("b1", 2, "INVALID_ARGUMENT: refused", 1.5, None)]
        assert log.pending_batches() == [] and log.buffered() == 1 and log.takeable() == 1  # alice's other report
        assert log.client_key("token:alice") == alice
        put = log.append_groups([([(os.urandom(16), None, b"x")], alice)], 8, 2, 1 << 30, 2, 10)
        assert put == [OVER_PERIOD_CAP]  # her two windows of period 0 kept
        assert log.retry_dead(["b1"]) == [("b1", 2)] and log.batch("b1").body.endswith(
            b"".join(wire.batch_entry(p) for p in (b"b", b"a"))
        )
    finally:
        log.close()


def test_shuffler_release_policy_is_a_pure_function():
    from lac.shuffler.policy import Row, select_batch

    rows = [Row(i, b"a" if i < 5 else bytes([i]), 7 + i % 2, None, 1) for i in range(10)]
    sel = select_batch(rows, threshold=6)
    assert sel.size == 6 and len(set(sel.taken)) == 6 and sum(s < 5 for s in sel.taken) == 1
    assert (sel.first_window, sel.last_window) == (7, 8) and sel.distinct_clients
    assert select_batch(rows, threshold=7) is None
    anonymous = [Row(i, None, 0, None, 1) for i in range(3)]
    assert not select_batch(anonymous, 3).distinct_clients


@pytest.mark.slow
def test_the_period_cap_is_enforced_on_a_real_shuffler(start_shuffler, sink, tmp_path):
    """Over RPC: RESOURCE_EXHAUSTED naming the setting, retry-after at the next period; batches carry the cap."""
    sink.deployment = Deployment(window_seconds=1.0, period_seconds=4.0, windows_per_period=1)
    state = tmp_path / "capped"
    alice = add_client(state / "clients.tokens", "alice")
    shf = start_shuffler(
        sink.address,
        auth="token",
        state_dir=state,
        min_batch=1,
        window_seconds=1.0,
        period_days=4 / 86400,
        max_windows_per_client_per_period=1,
    )
    while not 0.05 < time.time() % 4 < 1.5:  # early in a period, so the next window is in the same one
        time.sleep(0.05)
    assert [a.status for a in _submit(shf.address, [report()], alice)] == [shuffler_pb2.ACK_STATUS_STORED]
    time.sleep(1.0 - time.time() % 1 + 0.05)  # the next window, same period
    with pytest.raises(grpc.RpcError) as err:
        _submit(shf.address, [report()], alice)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_windows_per_client_per_period" in err.value.details()
    assert 1 <= int(dict(err.value.trailing_metadata())["retry-after-seconds"]) <= 4
    assert _status(shf.address).rejects["period_cap"] == 1
    wait_until(lambda: sink.batches(), timeout=30)
    assert [(b.privacy.windows_per_period, b.privacy.period_seconds) for b in sink.batches().values()] == [(1, 4.0)]


@pytest.mark.parametrize("in_flight", [1, 2])
def test_forwarder_keeps_a_bounded_number_of_batches_in_flight(start_shuffler, tmp_path, in_flight):
    """With forward_in_flight = k the curator is sent up to k batches at once, never more, each exactly once,
    and a batch counts as forwarded only after the curator acknowledged it."""
    from lac_testkit import Sink

    class Slow(Sink):
        def __init__(self):
            import threading

            self.lock, self.now, self.most, self.acked = threading.Lock(), 0, 0, []
            super().__init__()

        def _ingest(self, raw, context):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.3)
            with self.lock:
                self.now -= 1
            reply = super()._ingest(raw, context)
            with self.lock:
                self.acked.append(reply.batch_id)
            return reply

    sink = Slow()
    try:
        shf = start_shuffler(sink.address, min_batch=15, max_batch_bytes=1024, forward_in_flight=in_flight)
        reports = [report() for _ in range(60)]
        _submit(shf.address, reports)
        for _ in range(10):  # meanwhile: nothing counts as forwarded before the curator acknowledged it
            with sink.lock:
                status = _status(shf.address)
                assert status.batches_forwarded <= len(sink.acked)
            time.sleep(0.05)
        wait_for(lambda: _status(shf.address).batches_pending == 0, 30)
        status = _status(shf.address)
        assert status.batches_forwarded >= 3 and sink.most == in_flight
        assert sorted(sink.tags()) == sorted(tag_of(r.payload) for r in reports)
        assert len(sink.raw) == len(sink.batches()) == status.batches_forwarded  # each batch sent once
        assert status.buffered_reports == 0 and status.reports_forwarded == 60
    finally:
        sink.stop()
