"""The shuffler's report log (``ReportLog``), one suite over both databases (the ``store`` fixture: SQLite in the
state directory and a fresh database on a real PostgreSQL server): idempotency ids in two generations, quotas per
client per window, the period cap, releases of one report per client, delivery, counters, what a restart keeps, the
schema's numbered steps, and two logs over one database (replicas) taking one client's reports and one idempotency
id at once."""

from __future__ import annotations

import os
import threading
import time

import pytest
from lac_testkit import PROMPT

from lac.common.database import Migration
from lac.common.v1 import curator_pb2, reports_pb2
from lac.shuffler import schema
from lac.shuffler.reportlog import OVER_PERIOD_CAP, OVER_QUOTA, ReportLog

BIG = 1 << 30


@pytest.fixture
def open_log(tmp_path, store):
    """Factory: a ``ReportLog`` on the test's database (``state`` names its state directory); closed after."""
    opened: list[ReportLog] = []

    def make(state: str = "state") -> ReportLog:
        log = ReportLog(tmp_path / state, store)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def _sealed(tag: bytes) -> bytes:
    return reports_pb2.SealedPayload(
        encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=tag
    ).SerializeToString()


def test_idempotency_ids_are_remembered_for_one_to_two_windows(open_log):
    def put(log, ids):
        return log.append_groups([([(i, None, b"sealed") for i in ids], None)], window=0, quota=1, max_bytes=BIG)[0]

    a, b = b"a" * 8, b"b" * 8
    log = open_log()
    t0 = float(log.get_meta("seen_since"))
    assert put(log, [a]) == [True]
    assert not log.rotate_seen(3600, now=t0 + 10)  # the window has not passed
    assert log.rotate_seen(3600, now=t0 + 3601)
    assert put(log, [a, b]) == [False, True]  # a: still known, from the previous generation
    log.close()
    log = open_log()  # the generations and their start survive a restart
    assert not log.rotate_seen(3600, now=t0 + 3700)
    assert log.rotate_seen(3600, now=t0 + 7300)
    assert put(log, [a, b]) == [True, False]  # a forgotten after two windows; b remembered
    log.recount()
    assert log.buffered() == 3
    assert log.counters()["accepted"] == 3 and log.counters()["duplicates"] == 2


def test_one_report_per_client_per_batch_delivered_once(open_log):
    log = open_log()
    alice, bob, carol = (log.client_key(c) for c in ("token:alice", "token:bob", "token:carol"))

    def put(client, window, tag):
        r = log.append_groups([([(os.urandom(16), None, _sealed(tag))], client)], window, 1, BIG)
        assert r == [[True]]

    put(alice, 100, b"alice-100")
    put(bob, 100, b"bob-100")
    log.recount()  # PostgreSQL: the counts are the database's as last read (other replicas store too)
    assert log.release(threshold=3) is None  # two distinct clients: below the threshold, carried over
    put(alice, 101, b"alice-101")  # a new window: alice's quota allows one more
    assert log.append_groups([([(os.urandom(16), None, b"x")], alice)], 101, 1, BIG) == [OVER_QUOTA]
    log.recount()
    assert log.buffered() == 3 and log.takeable() == 2
    put(carol, 101, b"carol-101")
    log.recount()
    released = log.release(threshold=3)
    assert released is not None and released.size == 3 and log.pending_batches() == [released.batch_id]
    batch = log.batch(released.batch_id)
    assert batch.distinct_clients and (batch.first_window, batch.last_window) in ((100, 101), (101, 101))
    got = [p.data for p in curator_pb2.IngestBatchRequest.FromString(batch.body).reports]
    assert sum(g.startswith(b"alice") for g in got) == 1 and {b"bob-100", b"carol-101"} <= set(got)
    assert log.buffered() == 1 and log.takeable() == 1  # alice's other report waits for the next batch
    log.set_privacy(released.batch_id, b"statement")
    assert log.batch(released.batch_id).privacy == b"statement"
    log.close()
    log = open_log()  # a restart: the batch still pending, alice's report still buffered
    assert log.pending_batches() == [released.batch_id] and log.buffered() == 1
    assert log.batch(released.batch_id).body == batch.body  # the same bytes under the same id
    log.delivered(released.batch_id)
    log.delivered(released.batch_id)  # a second acknowledgement changes nothing
    assert log.pending_batches() == [] and log.counters()["reports_forwarded"] == 3
    assert [r[:3] for r in log.recent_batches()] == [(released.batch_id, 3, 1)]
    (left,) = log.database.execute("SELECT COUNT(*) FROM buffer").fetchone()
    assert left == 1  # the delivered release's rows are gone


def test_windows_per_client_per_period_are_capped(open_log):
    """With a cap of 2 windows per period of 4 windows, a client's third window of a period is refused whole;
    repeated reports in a counted window, other clients and the next period are not affected."""
    log = open_log()
    alice, bob = (log.client_key(c) for c in ("token:alice", "token:bob"))

    def put(client, window):
        return log.append_groups(
            [([(os.urandom(16), None, b"x")], client)], window, 2, BIG, period_cap=2, period_windows=4
        )[0]

    assert put(alice, 8) == [True] and put(alice, 8) == [True]  # period 2 = windows 8..11; quota 2 per window
    assert put(alice, 10) == [True]
    assert put(alice, 11) == OVER_PERIOD_CAP
    assert put(bob, 11) == [True]
    assert put(alice, 12) == [True]  # period 3: a fresh cap
    log.recount()
    assert log.buffered() == 5 and log.counters()["reject:period_cap"] == 1
    log.prune_quota(12, 4)
    assert log.append_groups([([(os.urandom(16), None, b"x")], alice)], 12, 2, BIG)[0] == [True]


def test_counters_kept_in_memory_are_saved_and_the_log_measured(open_log):
    log = open_log()
    log.count_reject("malformed", 3)
    assert log.counters()["reject:malformed"] == 3
    log.save_counters()
    log.probe(4096)
    assert log.used_bytes > 0
    free = log.free_bytes()
    assert (free is None) == (log.database.dialect == "postgresql") and (free is None or free > 0)
    log.close()
    log = open_log()
    assert log.counters()["reject:malformed"] == 3
    log.set_meta("deployment", b"\x01\x02")
    assert log.get_meta("deployment") == b"\x01\x02"


def test_the_schema_is_versioned_and_a_newer_one_refused(open_log):
    log = open_log()
    steps = schema.steps(log.database)
    newest = max(m.version for m in steps)
    assert log.database.migrate(schema.NAME, steps) == newest
    later = Migration(newest + 1, "a later version's step", lambda db: db.execute("CREATE TABLE later (x INTEGER)"))
    log.database.migrate(schema.NAME, (*steps, later))
    log.close()
    with pytest.raises(Exception, match=f"schema version {newest + 1}, newer than this program's"):
        open_log()


def test_two_replicas_enforce_one_quota_and_one_idempotency_id(open_log, store):
    """Two logs over one database (on SQLite they share the state directory, whose database is the one they can
    share), each used by one thread: one client's reports sent to both at once are stored up to the quota and no
    further, and one idempotency id sent to both is stored once."""
    logs = [open_log("state" if not store else f"replica{i}") for i in range(4)]
    client = logs[0].client_key("token:alice")
    assert all(log.client_key("token:alice") == client for log in logs)  # one key, from the database
    barrier = threading.Barrier(4)
    outcomes: list[object] = []
    shared_id = os.urandom(16)

    def submit(i: int) -> None:
        barrier.wait()
        for _ in range(5):  # quota 3 per window: 20 tries from four replicas
            outcomes.append(logs[i].append_groups([([(os.urandom(16), None, b"x")], client)], 7, 3, BIG)[0])
        outcomes.append(logs[i].append_groups([([(shared_id, None, b"y")], None)], 7, 3, BIG)[0])

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 24
    assert outcomes.count([True]) == 3 + 1 and outcomes.count(OVER_QUOTA) == 17 and outcomes.count([False]) == 3
    (rows,) = logs[0].database.execute("SELECT COUNT(*) FROM buffer").fetchone()
    assert rows == 4


def test_two_replicas_rotating_the_idempotency_ids_at_once_rotate_once(open_log, store):
    """A rotation dropped twice would forget ids after one window instead of two."""
    logs = [open_log("state" if not store else f"replica{i}") for i in range(2)]
    kept = os.urandom(16)
    assert logs[0].append_groups([([(kept, None, b"x")], None)], 0, 1, BIG)[0] == [True]
    t0 = float(logs[0].get_meta("seen_since"))
    barrier = threading.Barrier(2)
    rotated: list[bool] = []

    def rotate(log: ReportLog) -> None:
        barrier.wait()
        rotated.append(log.rotate_seen(3600, now=t0 + 3601))

    threads = [threading.Thread(target=rotate, args=(log,)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(rotated) == [False, True]
    assert logs[1].append_groups([([(kept, None, b"x")], None)], 0, 1, BIG)[0] == [False]  # still remembered


def _tables(db) -> dict[str, set[str]]:
    """Every table of ``db`` with its columns, PostgreSQL's ``rowid`` left out (SQLite's is implicit)."""
    return {t: set(db.columns(t)) - {"rowid"} for t in db.tables()}


def test_postgresql_holds_the_tables_and_columns_sqlite_holds(tmp_path, postgres_url):
    """Nothing more on PostgreSQL than in shuffler.sqlite (issue 35: privacy must not weaken)."""
    sqlite, pg = ReportLog(tmp_path / "a"), ReportLog(tmp_path / "b", postgres_url)
    try:
        assert _tables(pg.database) == _tables(sqlite.database)
        assert set(schema.TABLES) | {"schema_version"} == set(_tables(pg.database))
    finally:
        sqlite.close()
        pg.close()


def test_two_replicas_never_both_hold_the_release_lease(open_log, store):
    """Four logs over one database try to take the lease at once, again and again: exactly one holds it at every
    try; given up, it passes to another; on PostgreSQL, the holder's session ended by the server (as when its
    process dies) is the lease lost on its next check, and another takes it."""
    logs = [open_log("state" if not store else f"replica{i}") for i in range(4)]
    barrier = threading.Barrier(4)
    holders: list[list[int]] = [[] for _ in range(20)]

    def contend(i: int) -> None:
        for attempt in holders:
            barrier.wait()
            if logs[i].lease.acquire():
                attempt.append(i)
            barrier.wait()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(h) == 1 for h in holders) and len({h[0] for h in holders}) == 1  # one holder, which keeps it
    first = logs[holders[0][0]]
    assert first.lease.check()
    first.lease.release()
    assert not first.lease.held
    taken = [log for log in logs if log is not first and log.lease.acquire()]
    assert len(taken) == 1 and not first.lease.acquire()
    if store:
        second = taken[0]
        first.database.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
        )
        assert not second.lease.check() and not second.lease.held
        taken = [log for log in logs if log.lease.acquire()]
        assert len(taken) == 1 and taken[0].lease.check()


def test_two_replicas_releasing_at_once_never_take_a_report_twice(open_log, store):
    """A replica that lost the lease and has not noticed yet may release beside the new holder: the releases are
    serializable transactions, so no report is in two batches (at READ COMMITTED, both took the same rows)."""
    logs = [open_log("state" if not store else f"replica{i}") for i in range(2)]
    for i in range(40):
        key = logs[0].client_key(f"token:c{i}")
        logs[i % 2].append_groups([([(os.urandom(16), None, _sealed(b"r%d" % i))], key)], 5, 1, BIG)
    for log in logs:
        log.recount()
    barrier = threading.Barrier(2)
    released = []

    def release(log: ReportLog) -> None:
        barrier.wait()
        released.append(log.release(threshold=10))

    threads = [threading.Thread(target=release, args=(log,)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = [log.batch(r.batch_id) for r in released if r is not None and r.batch_id is not None]
    assert batches
    reports = [p.data for b in batches for p in curator_pb2.IngestBatchRequest.FromString(b.body).reports]
    assert len(reports) == len(set(reports)) and len(reports) <= 40


def test_a_silent_lease_holder_loses_the_lease_after_its_idle_session_timeout(tmp_path, postgres_url, monkeypatch):
    """A holder that stops checking (frozen, or its machine cut off) holds its lease only until the server ends its
    idle session (``idle_session_timeout``, here shortened to 1 s); then another replica takes it, and the silent
    one's next check says it lost it."""
    from lac.shuffler import lease

    monkeypatch.setattr(lease, "IDLE_SESSION_SECONDS", 1)
    silent, other = ReportLog(tmp_path / "a", postgres_url), ReportLog(tmp_path / "b", postgres_url)
    try:
        assert silent.lease.acquire() and not other.lease.acquire()
        deadline = time.monotonic() + PROMPT
        while not other.lease.acquire():  # the silent holder sends nothing meanwhile
            assert time.monotonic() < deadline, "the silent holder's lease never passed"
            time.sleep(0.2)
        assert not silent.lease.check() and not silent.lease.held
    finally:
        silent.close()
        other.close()
