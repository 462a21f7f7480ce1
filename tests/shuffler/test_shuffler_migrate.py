"""``lac shuffler migrate --to postgresql://…``: a stopped shuffler's SQLite report log copied into an empty
PostgreSQL database with nothing lost (every row of every table equal; the copy knows the clients' hashes, their
quota use and idempotency ids, its dead letters, and delivers the pending batch under its id with the same bytes;
the client key stays in the state directory, only its id is copied), a non-empty
target refused, and the SQLite log marked so that a shuffler started on it by mistake refuses."""

from __future__ import annotations

import os

import grpc
import pytest
from lac_testkit import DEPLOYMENT, batch_privacy, run_lac
from shuffler_testkit import report, tag_of, wait_for

from lac.common.database import PostgresDatabase
from lac.common.serde import deployment_to_proto
from lac.common.v1 import curator_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler import schema
from lac.shuffler.reportlog import OVER_QUOTA, ReportLog

BIG = 1 << 30


def _fill(state) -> dict:
    """A log with a row in every table (through its own writes): a pending release, a delivered one, a dead letter,
    reports still buffered, both generations of idempotency ids, quota and period use, counters, meta."""
    log = ReportLog(state)
    clients = [log.client_key(f"token:c{i}") for i in range(6)]
    ids = []

    def put(client, window, n=1):
        items = [(os.urandom(16), None, report(os.urandom(16)).payload.SerializeToString()) for _ in range(n)]
        ids.extend(i for i, _, _ in items)
        assert log.append_groups([(items, client)], window, 2, BIG, period_cap=3, period_windows=4) == [[True] * n]

    for c in clients[:3]:
        put(c, 8)
    log.rotate_seen(0.0)  # the ids so far are the previous generation now
    delivered = log.release(threshold=3)
    log.delivered(delivered.batch_id)
    for c in clients:
        put(c, 9, 2)
    pending = log.release(threshold=6)
    log.set_privacy(pending.batch_id, batch_privacy(6, window=9).SerializeToString())
    dead = log.release(threshold=6)  # each client's second report of window 9
    log.dead_letter(dead.batch_id, "FAILED_PRECONDITION: the curator's privacy unit differs")
    put(clients[0], 10)  # buffered
    log.count_reject("malformed", 2)
    log.save_counters()  # as the service does before it closes the log
    log.set_meta("deployment", deployment_to_proto(DEPLOYMENT).SerializeToString())  # the cached deployment
    seen = {
        "key": log.client_key("token:c0"),
        "pending": pending.batch_id,
        "dead": log.dead_letters(),
        "body": log.batch(pending.batch_id).body,
        "ids": ids,
        "counters": log.counters(),
        "buffered": log.buffered(),
    }
    log.close()
    return seen


def _rows(db, table: str) -> list[tuple]:
    """Every row of ``table`` but its ``rowid`` (PostgreSQL's; it orders like SQLite's implicit one)."""
    columns = ", ".join(c for c in db.columns(table) if c != "rowid")
    return sorted(db.execute(f"SELECT {columns} FROM {table}").fetchall(), key=repr)


def test_migrate_copies_every_row_and_the_copy_goes_on(tmp_path, capsys, postgres_url, sink, start_shuffler):
    state = tmp_path / "state"
    before = _fill(state)
    log = ReportLog(state)
    sqlite_rows = {t: _rows(log.database, t) for t in schema.TABLES}
    log.close()
    assert all(sqlite_rows.values()), [t for t, rows in sqlite_rows.items() if not rows]

    code, out, err = run_lac(capsys, "shuffler", "migrate", "--to", postgres_url, "--state-dir", str(state))
    assert code == 0, err
    assert "counts and checksums verified" in out and f"buffer {len(sqlite_rows['buffer'])}" in out
    pg = PostgresDatabase(postgres_url)
    try:
        for table in schema.TABLES:
            assert _rows(pg, table) == sqlite_rows[table], table
    finally:
        pg.close()

    log = ReportLog(state, postgres_url)
    assert log.client_key("token:c0") == before["key"]  # the same hashes: quota use and buffered clients carry over
    assert log.buffered() == before["buffered"] and log.counters() == before["counters"]
    assert log.pending_batches() == [before["pending"]] and log.batch(before["pending"]).body == before["body"]
    assert log.dead_letters() == before["dead"]
    assert log.append_groups([([(os.urandom(16), None, b"x")], before["key"])], 9, 2, BIG) == [OVER_QUOTA]
    assert log.append_groups([([(before["ids"][0], None, b"x")], None)], 11, 2, BIG) == [[False]]  # remembered
    log.close()
    with pytest.raises(RuntimeError, match="was copied to the PostgreSQL store"):
        ReportLog(state)
    code, _, err = run_lac(capsys, "shuffler", "backup", "--state-dir", str(state), str(tmp_path / "bak"))
    assert code != 0 and "pg_dump" in err

    # A shuffler served from the copy delivers the pending batch under its id, with the same reports.
    shf = start_shuffler(sink.address, state_dir=state, store=postgres_url, min_batch=1000)
    wait_for(lambda: before["pending"] in sink.batches(), timeout=60)
    sent = sink.batches()[before["pending"]]
    assert list(sent.reports) == list(curator_pb2.IngestBatchRequest.FromString(before["body"]).reports)
    with grpc.insecure_channel(shf.address) as ch:
        item = shuffler_pb2.ClientReport(idempotency_id=before["ids"][-1], payload=report(os.urandom(16)).payload)
        acks = shuffler_pb2_grpc.ShufflerStub(ch).Submit(shuffler_pb2.SubmitRequest(reports=[item]), timeout=30)
    assert [a.status for a in acks.acks] == [shuffler_pb2.ACK_STATUS_DUPLICATE]
    assert len({tag_of(p) for p in sent.reports}) == 6  # one report of each client


def test_migrate_refuses_a_target_that_holds_state(tmp_path, capsys, postgres_url):
    _fill(tmp_path / "a")
    assert run_lac(capsys, "shuffler", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "a"))[0] == 0
    _fill(tmp_path / "b")
    code, _, err = run_lac(capsys, "shuffler", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "b"))
    assert code != 0 and "is not empty" in err and "buffer:" in err
    ReportLog(tmp_path / "b").close()  # the refused source is still the state (not marked as copied)
    code, _, err = run_lac(capsys, "shuffler", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "none"))
    assert code != 0 and "holds no shuffler database" in err
