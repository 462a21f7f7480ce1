"""``lac curator migrate --to postgresql://…``: a stopped curator's SQLite state copied into an empty PostgreSQL
database with nothing lost (every row of every table equal, and a curator served from the copy answers as the
original did: budget, releases, request ids, exports, quarantine), a non-empty target refused, and the SQLite
database marked so that a curator started on it by mistake refuses."""

from __future__ import annotations

import json
import os

import grpc
import numpy as np
import pytest
from lac_testkit import batch_privacy, content, run_lac

from lac.common import envelope
from lac.common.database import PostgresDatabase
from lac.common.errors import FailedPrecondition
from lac.common.privacy import Budget
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.base.ngrams import report_items
from lac.curator.store import schema
from lac.curator.store.store import UNIT_FIELDS, CuratorStore, Quarantined

DAY = 86400.0


def _fill(state) -> dict:
    """A state with a row in every table (the store's own writes), and what reading it gives."""
    s = CuratorStore(state, quarantine_max_rows=3, keep_words=True)
    s.keep_unit({"window_seconds": DAY, "reports_per_window": 1, "period_seconds": 365 * DAY, "windows_per_period": 0})
    texts = [[["the", "dog", "sleeps"]], [["a", "fox"]], [["the", "sun"]]]
    for b in range(4):
        bad = [Quarantined("decrypt_failed", f"report {i}", os.urandom(8)) for i in range(2)]
        ids = [os.urandom(16) for _ in texts] + [b"replayed-report!"]
        s.add_batch(f"b{b}", ids, lambda keep: report_items([(texts + texts)[i] for i in keep], 3), bad, 30 * DAY,
                    privacy=batch_privacy(3).SerializeToString(), windows=(10 + b, 10 + b))  # fmt: skip
    for i, (windows, charge) in enumerate([([10, 11], Budget(0.5, 1e-7)), ([12], Budget(0.25, 0.0))]):
        record = json.dumps({"mechanism": "posterior", "differentially_private": True}).encode()
        s.add_release(f"r{i}", record, ("the dog", "a fox"), np.log([0.25, 0.75]), np.array([1.5, 2.5]), windows,
                      charge, Budget(1.0, 1e-6), request_id=f"q{i}", spec=f'{{"i": {i}}}')  # fmt: skip
    s.add_release("d0", b'{"mechanism": "kanon", "differentially_private": false}', ("the",), np.zeros(1), None,
                  [13], None, Budget(1.0), data_dependent_cap=3)  # fmt: skip
    s.add_noisy_count(10, 13, 11.75, 4.0, Budget(0.125, 0.0), Budget(1.0, 1e-6))
    s.add_export("e1", "exporter", 10, 10, 3, '{"local": true}', batches=1)
    seen = _read(s)
    s.close()
    return seen


def _read(s: CuratorStore) -> dict:
    return {
        "counts": s.counts(),
        "spent": s.spent(),
        "data_dependent": s.data_dependent_releases(),
        "releases": s.releases(),
        "r0": [x.tolist() if isinstance(x, np.ndarray) else x for x in s.release("r0")],
        "requests": [s.release_for_request(f"q{i}", f'{{"i": {i}}}') for i in range(2)],
        "noisy": s.noisy_count(10, 13)[:3],
        "exports": s.exports(),
        "quarantine": s.quarantine(),
        "rejects": s.rejects(),
        "windows": s.windows(),
        "by_window": s.reports_by_window(),
        "segments": s.segment_paths(),
        "export_batches": s.export_batches(10, 13),
        "by_mechanism": s.releases_by_mechanism(),
    }


def _rows(db, table: str) -> list[tuple]:
    """Every row of ``table`` but its ``rowid`` (PostgreSQL's; it orders like SQLite's implicit one)."""
    columns = ", ".join(c for c in db.columns(table) if c != "rowid")
    return sorted(db.execute(f"SELECT {columns} FROM {table}").fetchall(), key=repr)


def test_migrate_copies_every_row_and_refuses_the_sqlite_copy_after(tmp_path, capsys, postgres_url):
    state = tmp_path / "state"
    before = _fill(state)
    sqlite_rows = {}
    s = CuratorStore(state)
    for table in schema.TABLES:
        sqlite_rows[table] = _rows(s.database, table)
    s.close()
    assert all(sqlite_rows[t] for t in schema.TABLES), [t for t in schema.TABLES if not sqlite_rows[t]]

    code, out, err = run_lac(capsys, "curator", "migrate", "--to", postgres_url, "--state-dir", str(state))
    assert code == 0, err
    assert "counts and checksums verified" in out and f"--store {postgres_url}" in out
    assert f"report_ids {len(sqlite_rows['report_ids'])}" in out

    pg = PostgresDatabase(postgres_url)
    try:
        for table in schema.TABLES:  # every column but PostgreSQL's rowid, which orders like SQLite's
            assert _rows(pg, table) == sqlite_rows[table], table
    finally:
        pg.close()

    s = CuratorStore(state, store=postgres_url, quarantine_max_rows=3, keep_words=True)
    assert _read(s) == before
    s.keep_unit(dict(zip(UNIT_FIELDS, (DAY, 1, 365 * DAY, 0), strict=True)))  # the recorded unit came along
    bad = [Quarantined("decrypt_failed", "after the move", b"new")]
    s.add_batch("b9", [], lambda keep: None, bad, DAY)  # new ids continue after the copied ones
    assert [q[2] for q in s.quarantine()] == ["after the move", "report 1", "report 0"]
    assert s.release_for_request("q0", '{"i": 0}') == "r0"
    s.close()

    with pytest.raises(FailedPrecondition, match="was copied to the PostgreSQL store"):
        CuratorStore(state)  # the SQLite database is no longer the state
    code, _, err = run_lac(capsys, "curator", "backup", "--state-dir", str(state), str(tmp_path / "bak"))
    assert code != 0 and "pg_dump" in err


def _views(stub) -> tuple:
    """What an operator and an analyst see of a curator's state."""
    budget = stub.GetBudget(curator_pb2.BudgetRequest(), timeout=30)
    releases = stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=30)
    status = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=30)
    return budget.windows, releases.releases, (status.batches, status.reports, status.releases, status.quarantined)


def test_a_curator_served_from_the_copy_answers_as_before(tmp_path, capsys, postgres_url, start_curator):
    """Through the real service: batches (one report quarantined), a release with a request id; after the copy
    the budget, the releases and the status read the same, the retried request returns the same release without
    spending, and a redelivered batch is a duplicate."""
    state = tmp_path / "state"
    cur = start_curator(state_dir=state, allow_plaintext_payloads=True, budget_epsilon=5.0)
    request = curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-6, force=True, request_id="req-1")
    batch = curator_pb2.IngestBatchRequest(
        batch_id="b1",
        reports=[envelope.seal_insecure(content(["the", "dog", "sleeps"])) for _ in range(30)]
        + [envelope.seal_insecure(content(["the", "dog"], epsilon=1e3))],  # quarantined: ε over the deployment's
        privacy=batch_privacy(31),
    )
    with grpc.insecure_channel(cur.address) as ch:
        assert curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(batch, timeout=30).rejected == 1
        stub = curator_pb2_grpc.CuratorStub(ch)
        released = stub.Release(request, timeout=60).release_id
        before = _views(stub)
    cur.stop()

    code, _, err = run_lac(capsys, "curator", "migrate", "--to", postgres_url, "--state-dir", str(state))
    assert code == 0, err
    cur = start_curator(state_dir=state, store=postgres_url, allow_plaintext_payloads=True, budget_epsilon=5.0)
    with grpc.insecure_channel(cur.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        assert _views(stub) == before
        assert stub.Release(request, timeout=60).release_id == released
        assert curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(batch, timeout=30).duplicate
        assert _views(stub) == before


def test_migrate_refuses_a_target_that_holds_state(tmp_path, capsys, postgres_url):
    _fill(tmp_path / "a")
    assert run_lac(capsys, "curator", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "a"))[0] == 0
    pg = PostgresDatabase(postgres_url)
    try:
        batches = pg.execute("SELECT COUNT(*) FROM batches").fetchone()[0]
    finally:
        pg.close()
    s = CuratorStore(tmp_path / "b")
    s.add_batch("other", [os.urandom(16)], lambda keep: report_items([[["a", "b"]]], 2), [], DAY)
    s.close()
    code, _, err = run_lac(capsys, "curator", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "b"))
    assert code != 0 and "is not empty" in err and "batches: 4 rows" in err
    pg = PostgresDatabase(postgres_url)
    try:
        assert pg.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == batches  # nothing added
    finally:
        pg.close()
    CuratorStore(tmp_path / "b").close()  # the refused source is still the state (not marked as copied)
    code, _, err = run_lac(capsys, "curator", "migrate", "--to", "sqlite:///x", "--state-dir", str(tmp_path / "b"))
    assert code != 0 and "postgresql://" in err
    code, _, err = run_lac(capsys, "curator", "migrate", "--to", postgres_url, "--state-dir", str(tmp_path / "none"))
    assert code != 0 and "holds no curator database" in err
