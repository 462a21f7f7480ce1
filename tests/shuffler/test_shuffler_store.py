"""The shuffler's report log (``ReportLog``), one suite over both databases (the ``store`` fixture: SQLite in the
state directory and a fresh database on a real PostgreSQL server): idempotency ids in two generations, quotas per
client per window, the period cap (a count and the last window per client and period), releases of one report per
client, delivery, dead letters, counters, what a restart keeps, the client key (a file in the state directory, only
its id in the database), the schema's numbered steps (an earlier layout's period windows become counts, a key kept
inside moves out), and logs over one database (replicas) taking one client's reports and one idempotency id at once
and agreeing on one client key."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from lac_testkit import DEADLINE, PROMPT

from lac.common.database import Migration, open_database
from lac.common.files import private_dir
from lac.common.v1 import curator_pb2, reports_pb2
from lac.shuffler import schema
from lac.shuffler.reportlog import KEY_FILE, OVER_PERIOD_CAP, OVER_QUOTA, ClientKeyError, ReportLog, key_id, write_key

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


def _replicas(open_log, store: str, n: int) -> list[ReportLog]:
    """``n`` logs over the test's one database: on SQLite in one state directory (the database they can share), on
    PostgreSQL each in its own, holding a copy of the first one's client.key as the operator gives it."""
    first = open_log("state" if not store else "replica0")
    for i in range(1, n if store else 0):
        write_key(
            private_dir(first.state_dir.parent / f"replica{i}") / KEY_FILE, (first.state_dir / KEY_FILE).read_bytes()
        )
    return [first] + [open_log("state" if not store else f"replica{i}") for i in range(1, n)]


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
    assert log.database.execute("SELECT DISTINCT period FROM period_use").fetchall() == [(3,)]
    assert log.append_groups([([(os.urandom(16), None, b"x")], alice)], 12, 2, BIG)[0] == [True]


def test_the_period_cap_keeps_a_count_and_the_last_window_per_client(open_log):
    """Issue 34.8: for the cap the log keeps, per client (keyed hash) and period, how many windows the client
    stored reports in and the last one, never which windows; a window before the last counts as a new one (a clock
    set back only refuses more)."""
    log = open_log()
    alice = log.client_key("token:alice")

    def put(window):
        return log.append_groups(
            [([(os.urandom(16), None, b"x")], alice)], window, 2, BIG, period_cap=3, period_windows=10
        )[0]

    assert [put(w) for w in (20, 20, 23, 27)] == [[True]] * 4  # period 2: windows 20..29
    assert "period_windows" not in log.database.tables()
    assert log.database.execute("SELECT period, client, windows, last_window FROM period_use").fetchall() == [
        (2, alice, 3, 27)
    ]
    assert put(27) == [True] and put(25) == OVER_PERIOD_CAP and put(28) == OVER_PERIOD_CAP


def test_an_earlier_layouts_period_windows_become_counts(tmp_path, open_log, store):
    """Schema step 3 on a log at step 2 (every window a client used in a period, one row each): a count and the last
    window per client and period, the windows' table dropped; on SQLite the file is rewritten (no free page keeps
    the dropped rows)."""
    state = private_dir(tmp_path / "old")
    db = open_database(state / "shuffler.sqlite", store)
    db.migrate(schema.NAME, schema.steps(db)[:2])
    rows = [(2, b"alice", 21), (2, b"alice", 24), (2, b"bob", 22), (3, b"bob", 30)]
    db.transaction(lambda: db.executemany("INSERT INTO period_windows VALUES (?, ?, ?)", rows))
    db.close()
    log = open_log("old")
    assert set(log.database.execute("SELECT period, client, windows, last_window FROM period_use")) == {
        (2, b"alice", 2, 24),
        (2, b"bob", 1, 22),
        (3, b"bob", 1, 30),
    }
    assert "period_windows" not in log.database.tables()
    (version,) = log.database.execute("SELECT MAX(version) FROM schema_version").fetchone()
    assert version == max(m.version for m in schema.steps(log.database))
    if log.database.dialect == "sqlite":
        assert log.database.execute("PRAGMA freelist_count").fetchone()[0] == 0


def _batch_ids(log: ReportLog, n: int) -> list[str]:
    """One release of ``n`` clients' reports (a batch each way the log splits it); the pending batches' ids."""
    for i in range(n):
        client = log.client_key(f"token:{os.urandom(4).hex()}-{i}")
        assert log.append_groups([([(os.urandom(16), None, _sealed(b"r" * 100))], client)], 1, 1, BIG) == [[True]]
    log.recount()  # on PostgreSQL the counts are the database's, read by the lease holder every second
    return log.pending_batches() if log.release(threshold=2, max_batch_bytes=250) else []


def test_dead_letters_are_set_aside_retried_and_dropped(open_log):
    """Issue 34.11: a batch the curator refused for good is a dead letter: not pending (newer batches go on), listed
    with its refusal, kept over a restart; retried it is pending again in its old place; dropped, its reports are
    deleted, and once no part of its release waits, the release's other parts' rows too. Ids that are not dead
    letters are refused (KeyError naming them)."""
    log = open_log()
    first, second = _batch_ids(log, 4)  # one release in two batches of two reports (250 bytes at most each)
    (third,) = [b for b in _batch_ids(log, 2) if b not in (first, second)]
    log.dead_letter(first, "INVALID_ARGUMENT: bad batch")
    log.dead_letter(first, "again")  # already a dead letter: nothing changes
    assert log.pending_batches() == [second, third]
    ((batch_id, n, refusal, since, privacy),) = log.dead_letters()
    assert (batch_id, n, refusal, privacy) == (first, 2, "INVALID_ARGUMENT: bad batch", None) and since > 0
    assert [r[4] for r in log.recent_batches()] == [None, None, "INVALID_ARGUMENT: bad batch"]
    assert log.counters()["batches_dead_lettered"] == 1
    log.close()
    log = open_log()
    assert log.pending_batches() == [second, third] and [r[0] for r in log.dead_letters()] == [first]
    with pytest.raises(KeyError) as refused:
        log.retry_dead([first, second, "nope"])
    assert refused.value.args[0] == [second, "nope"]
    assert log.retry_dead([first]) == [(first, 2)]
    assert log.pending_batches() == [first, second, third] and log.dead_letters() == []

    body = log.batch(second).body
    log.dead_letter(first, "FAILED_PRECONDITION: unit")
    log.delivered(second)  # the release's other part: its rows stay while the dead letter's wait
    (buffered,) = log.database.execute("SELECT COUNT(*) FROM buffer").fetchone()
    assert buffered == 6
    assert log.drop_dead() == [(first, 2)]
    assert log.pending_batches() == [third] and log.dead_letters() == []
    (buffered,) = log.database.execute("SELECT COUNT(*) FROM buffer").fetchone()
    assert buffered == 2  # the whole first release's rows are gone; the third batch's stay
    assert len(log.batch(third).body) > 0 and len(body) > 0
    counters = log.counters()
    assert counters["batches_dropped_dead_letter"] == 1 and counters["reports_dropped_dead_letter"] == 2
    assert counters["batches_dead_lettered"] == 2
    with pytest.raises(KeyError):
        log.drop_dead([third])


def test_the_client_key_is_a_file_and_only_its_id_is_in_the_database(tmp_path, open_log, store):
    """Issue 34.8: the key of the client hashes is STATE_DIR/client.key (0600), the database records its id only; a
    log opened with another key or none refuses (ClientKeyError). On PostgreSQL a replica's state directory needs a
    copy of that file: one without refuses, one with it makes the same hashes."""
    log = open_log()
    alice = log.client_key("token:alice")
    path = log.state_dir / KEY_FILE
    key = path.read_bytes()
    assert len(key) == 32 and oct(path.stat().st_mode & 0o777) == "0o600"
    meta = dict(log.database.execute("SELECT name, value FROM meta").fetchall())
    assert bytes(meta["client_key_id"]) == key_id(key) and "client_key" not in meta
    assert not any(key in bytes(v) for v in meta.values())
    log.close()
    path.write_bytes(os.urandom(32))
    with pytest.raises(ClientKeyError, match="is not the key"):
        open_log()
    path.unlink()
    with pytest.raises(ClientKeyError, match="is missing"):
        open_log()
    write_key(path, key)
    assert open_log().client_key("token:alice") == alice
    if store:
        with pytest.raises(ClientKeyError, match="every replica over one PostgreSQL database holds the same one"):
            open_log("replica")
        assert not (tmp_path / "replica" / KEY_FILE).exists()
        write_key(tmp_path / "replica" / KEY_FILE, key)
        assert open_log("replica").client_key("token:alice") == alice


def test_a_key_kept_inside_the_database_moves_out(open_log):
    """A log that kept its client key in meta (before issue 34.8) moves it to client.key at its next start and
    keeps only its id, the hashes unchanged."""
    log = open_log()
    alice = log.client_key("token:alice")
    path = log.state_dir / KEY_FILE
    key = path.read_bytes()
    db = log.database

    def earlier_layout() -> None:
        db.execute("DELETE FROM meta WHERE name = 'client_key_id'")
        db.execute("INSERT INTO meta VALUES ('client_key', ?)", (key,))

    db.transaction(earlier_layout)
    log.close()
    path.unlink()
    log = open_log()
    assert log.client_key("token:alice") == alice and path.read_bytes() == key
    meta = dict(log.database.execute("SELECT name, value FROM meta").fetchall())
    assert bytes(meta["client_key_id"]) == key_id(key) and "client_key" not in meta


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
    logs = _replicas(open_log, store, 4)
    client = logs[0].client_key("token:alice")
    assert all(log.client_key("token:alice") == client for log in logs)  # one key
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
    logs = _replicas(open_log, store, 2)
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


def test_replicas_starting_together_on_a_new_database_agree_on_one_client_key(tmp_path, postgres_url, monkeypatch):
    """Four replicas with empty state directories starting at once over a new PostgreSQL database, each having made
    a key before any records one (held at a barrier): the first to record its key's id serves; every other refuses
    (ClientKeyError) and removes the key it made, so its operator copies the first one's."""
    from lac.shuffler import reportlog

    barrier = threading.Barrier(4, timeout=DEADLINE)
    made = reportlog.write_key

    def write_then_wait(path, key) -> None:
        made(path, key)
        barrier.wait()

    monkeypatch.setattr(reportlog, "write_key", write_then_wait)
    opened: list[ReportLog] = []
    refused: list[ClientKeyError] = []

    def start(i: int) -> None:
        try:
            opened.append(ReportLog(tmp_path / f"replica{i}", postgres_url))
        except ClientKeyError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(opened) == 1 and len(refused) == 3 and all("is not the key" in str(e) for e in refused)
        keys = list(tmp_path.glob(f"replica*/{KEY_FILE}"))
        assert keys == [opened[0].state_dir / KEY_FILE]
    finally:
        for log in opened:
            log.close()


def test_two_replicas_never_both_hold_the_release_lease(open_log, store):
    """Four logs over one database try to take the lease at once, again and again: exactly one holds it at every
    try; given up, it passes to another; on PostgreSQL, the holder's session ended by the server (as when its
    process dies) is the lease lost on its next check, and another takes it."""
    logs = _replicas(open_log, store, 4)
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
    logs = _replicas(open_log, store, 2)
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
    silent = ReportLog(tmp_path / "a", postgres_url)
    (tmp_path / "b").mkdir(mode=0o700)
    shutil.copy(tmp_path / "a" / KEY_FILE, tmp_path / "b" / KEY_FILE)  # every replica holds the same client key
    other = ReportLog(tmp_path / "b", postgres_url)
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
