"""Shuffler replicas over one PostgreSQL database as real processes (issue 35 item 2): three ``lac shuffler serve
--store postgresql://…`` in front of one curator (``Sink``), SDK clients with tokens submitting through failover to
all three. One replica at a time holds the release lease; SIGKILL to the holder, once while a batch it released is
stored but not yet acknowledged by the curator and once mid-run, passes the lease to a survivor promptly, and every
acknowledged report reaches the curator exactly once, in batches the curator is sent under one id each."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from lac_testkit import DEADLINE, PROMPT, lease_holders, shuffler_replica_states
from shuffler_testkit import ServeProc, report, tag_of, wait_for

import lac.client
from lac.client import AckStatus
from lac.common.database import PostgresDatabase
from lac.common.v1 import curator_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_client, add_clients

N_CLIENTS = 90


def _serve(url: str, state, curator: str, workdir) -> ServeProc:
    """``lac shuffler serve`` over the database ``url``, releasing a batch of one report or more after each commit
    and each second, retrying deliveries at least every 0.2 s."""
    args = ["--state-dir", str(state), "--store", url, "--curator", curator, "--insecure", "--allow-plaintext-payloads"]
    args += ["--min-batch", "1", "--release-interval-seconds", "1", "--forward-retry-max-seconds", "0.2"]
    return ServeProc(args, workdir)


def _stub(address: str):
    channel = grpc.insecure_channel(address)
    return channel, shuffler_pb2_grpc.ShufflerStub(channel)


@pytest.mark.slow
def test_replicas_over_one_postgresql_pass_the_lease_and_lose_nothing(tmp_path, sink, postgres_url):
    tokens_file = tmp_path / "clients.tokens"
    ids = [f"client-{i:03d}" for i in range(N_CLIENTS)]
    tokens = dict(zip(ids, add_clients(tokens_file, ids)))
    ops = [("authorization", f"Bearer {add_client(tokens_file, 'ops', role='operator')}")]
    procs: list[ServeProc] = []
    for i, state in enumerate(shuffler_replica_states(tmp_path, 3, tokens_file)):
        try:
            procs.append(_serve(postgres_url, state, sink.address, tmp_path / f"proc{i}"))
        except BaseException:  # no replica left running when another cannot start
            for p in procs:
                p.stop()
            raise
    addresses = [p.address for p in procs]
    alive = set(range(3))

    def holders() -> list[int]:
        return [addresses.index(a) for a in lease_holders([addresses[i] for i in sorted(alive)], ops)]

    def new_holder(after: float) -> tuple[int, float]:
        """The replica that takes the lease after a kill at ``after``, and how long after the kill it held it."""
        wait_for(lambda: len(holders()) == 1, timeout=DEADLINE)
        return holders()[0], time.monotonic() - after

    acked: dict[str, bytes] = {}  # client -> the tag of its acknowledged report
    sdk = lac.client.ShufflerClient(addresses, insecure=True, timeout=DEADLINE, attempts=5)

    def submit(client: str) -> None:
        r = report()
        acks = sdk.submit_prepared([r], token=tokens[client])
        # DUPLICATE: a try at a replica killed after its commit stored it, and the retry at a survivor found it
        assert [a.status for a in acks] in ([AckStatus.STORED], [AckStatus.DUPLICATE]), client
        acked[client] = tag_of(r.payload)

    pool = ThreadPoolExecutor(4)
    try:
        first, _ = new_holder(time.monotonic())
        assert holders() == [first]
        other = next(i for i in alive if i != first)
        channel, stub = _stub(addresses[other])
        with channel, pytest.raises(grpc.RpcError) as refused:
            stub.Flush(shuffler_pb2.FlushRequest(), metadata=ops, timeout=DEADLINE)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "another shuffler replica" in refused.value.details(), refused.value.details()

        # Mid-release: the curator refuses batches, so the holder's batches are stored and sent, never acknowledged.
        sink.refuse_batches = True
        for f in [pool.submit(submit, c) for c in ids[:30]]:
            f.result()
        wait_for(lambda: len(sink.raw) > 0, timeout=DEADLINE)
        rest = [pool.submit(submit, c) for c in ids[30:]]  # submissions go on while holders die
        killed_at = time.monotonic()
        procs[first].kill()
        alive.discard(first)
        second, passed_after = new_holder(killed_at)
        assert passed_after < PROMPT, f"the lease passed {passed_after:.1f} s after the holder's SIGKILL"
        refused_ids = set(sink.batches())  # sent by the dead holder, refused
        sink.refuse_batches = False  # the new holder delivers the dead one's batches under their ids

        wait_for(lambda: len(acked) >= 60, timeout=DEADLINE)
        killed_at = time.monotonic()
        procs[second].kill()  # mid-run
        alive.discard(second)
        third, passed_after_again = new_holder(killed_at)
        assert passed_after_again < PROMPT, f"the lease passed {passed_after_again:.1f} s after the SIGKILL"
        for f in rest:
            f.result()  # every submission acknowledged: the survivors served throughout
        assert len(acked) == N_CLIENTS
        channel, stub = _stub(addresses[third])

        def drained() -> bool:
            status = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), metadata=ops, timeout=DEADLINE)
            return status.buffered_reports == 0 and status.batches_pending == 0

        with channel:
            wait_for(drained, timeout=2 * DEADLINE)
        for i in alive:
            assert procs[i].health() == "SERVING"
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        sdk.close()
        for p in procs:
            p.stop()
    got = sink.tags()
    assert len(got) == len(set(got)), "a report reached the curator in two batches"
    assert set(got) == set(acked.values()), "a report reached the curator that was never acknowledged"
    db = PostgresDatabase(postgres_url)
    try:
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
        (pending,) = db.execute("SELECT COUNT(*) FROM batches WHERE delivered = 0").fetchone()
    finally:
        db.close()
    sent: dict[str, set[tuple[bytes, ...]]] = {}  # batch id -> the report lists it was sent with
    for raw in sink.raw:
        batch = curator_pb2.IngestBatchRequest.FromString(raw)
        sent.setdefault(batch.batch_id, set()).add(tuple(r.SerializeToString() for r in batch.reports))
    # Every batch released was acknowledged and marked delivered once; one sent again (by the next holder) was sent
    # under its id with the same reports in the same order, which a curator stores once.
    assert counters["batches_released"] == counters["batches_forwarded"] == len(sent) and pending == 0
    assert counters["accepted"] == N_CLIENTS and counters["reports_forwarded"] == N_CLIENTS
    assert all(len(contents) == 1 for contents in sent.values())
    assert refused_ids and refused_ids <= set(sent)
    print(f"lease passed {passed_after:.1f} s and {passed_after_again:.1f} s after SIGKILL; load {os.getloadavg()}")
