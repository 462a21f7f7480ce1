"""The curator's durable state (``CuratorStore``), one suite over both databases (the ``store`` fixture: SQLite in
the state directory and a fresh database on a real PostgreSQL server): batches and their idempotency, the replay
window, quarantine, the ledger's charge and release request ids, noisy counts, exports, the journal, the privacy
unit and the first window of reports at the channel's ε, the schema's numbered steps, and two stores over one
database (replicas) racing for the same batch, request id and last ε."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from curator_testkit import DAY, UNIT, opened_stores
from curator_testkit import stored_items as _items
from curator_testkit import stored_release as _release

from lac.common.database import Migration
from lac.common.errors import AlreadyExists, ErrorReason, FailedPrecondition
from lac.common.privacy import Budget
from lac.curator.base.ngrams import report_items
from lac.curator.store import journal, schema
from lac.curator.store import segments as seg
from lac.curator.store.store import (
    OPENED,
    ORPHAN_GRACE_SECONDS,
    UNIT_FIELDS,
    CuratorStore,
    PrivacyUnitChanged,
    Quarantined,
)


@pytest.fixture
def open_store(tmp_path, store):
    """Factory: a ``CuratorStore`` on the test's database (``state`` names its state directory); closed after."""
    with opened_stores(tmp_path, store) as make:
        yield make


def test_a_batch_is_stored_once_and_read_back(open_store, tmp_path):
    s = open_store()
    texts = [[["the", "dog"]], [["a", "fox"]]]
    r = s.add_batch("b1", [b"r1" * 8, b"r2" * 8], lambda keep: report_items([texts[i] for i in keep], 2), [], DAY,
                    windows=(5, 6), privacy=b"\x08\x02")  # fmt: skip
    assert (r.duplicate, r.accepted, r.rejected) == (False, 2, 0)
    assert s.add_batch("b1", [b"r3" * 8], _items, [], DAY).duplicate  # by batch id: nothing more stored
    assert s.has_batch("b1") and not s.has_batch("b2")
    assert s.counts() == {"batches": 1, "reports": 2, "releases": 0, "quarantined": 0}
    assert s.windows() == (5, 6) and s.reports_by_window() == {6: 2} and s.report_count(5, 6) == 2
    (path,) = s.segment_paths(5, 6)
    assert seg.read(path).n_reports == 2 and s.segment_paths(7, 8) == []
    assert s.export_batches(6, 6) == [(5, 6, 2, b"\x08\x02", None)]


def test_replay_window_prunes_old_ids(open_store):
    s = open_store()
    rid = os.urandom(16)
    assert s.add_batch("b1", [rid, rid], _items, [], 30 * DAY, now=0.0).rejects == {"replayed_report_id": 1}
    assert s.add_batch("b2", [rid], _items, [], 30 * DAY, now=29 * DAY).rejects == {"replayed_report_id": 1}
    assert s.add_batch("b2", [rid], _items, [], 30 * DAY, now=29 * DAY).duplicate
    r = s.add_batch("b3", [rid], _items, [], 30 * DAY, now=31 * DAY)  # forgotten after the window
    assert (r.accepted, r.rejected) == (1, 0)
    assert s.counts()["reports"] == 2 and sum(seg.read(p).n_reports for p in s.segment_paths()) == 2
    assert s.rejects() == {"replayed_report_id": 2}


def test_quarantine_keeps_only_the_newest_rows_and_no_opened_report(open_store):
    s = open_store(quarantine_max_rows=5)

    def no_segment(keep):
        raise AssertionError("no report is kept")

    for b in range(4):
        bad = [Quarantined("decrypt_failed", f"batch {b} report {i}", bytes([b, i])) for i in range(3)]
        assert s.add_batch(f"b{b}", [], no_segment, bad, DAY).rejects == {"decrypt_failed": 3}
    assert s.counts()["quarantined"] == 5
    assert [r[3] for r in s.quarantine()] == [bytes([3, 2]), bytes([3, 1]), bytes([3, 0]), bytes([2, 2]), bytes([2, 1])]
    assert s.rejects() == {"decrypt_failed": 12}  # the totals are kept
    opened = next(iter(OPENED))
    s.add_batch("b9", [], no_segment, [Quarantined(opened, "token 1 of sentence 2", b"sealed")], DAY)
    assert s.quarantine(1) == [("b9", str(opened), "token 1 of sentence 2", b"")]


def test_release_files_and_ledger_entries_appear_together(open_store, store, tmp_path):
    s = open_store()
    releases = tmp_path / "state" / "releases"
    assert _release(s, "r1", "q1") == "r1"
    assert _release(s, "r2", "q1") == "r1"  # same request: nothing written or spent
    assert not (releases / "r2.npz").exists()
    assert s.spent() == {3: Budget(1.0, 0.0), 4: Budget(1.0, 0.0)}
    assert s.release_for_request("q1", "{}") == "r1"
    with pytest.raises(AlreadyExists, match="other parameters"):
        _release(s, "r3", "q1", spec='{"epsilon": 2}')
    with pytest.raises(FailedPrecondition, match="budget exhausted") as refused:  # inside the transaction: no file
        _release(s, "r4", windows=[3], charge=Budget(9.5, 0.0))
    assert refused.value.error_reason == ErrorReason.BUDGET_EXHAUSTED
    assert sorted(p.name for p in releases.iterdir()) == ["r1.npz"]
    record, items, log_probs, pseudo, errors = s.release("r1")
    assert json.loads(record)["release_id"] == "r1" and items == ("a", "b") and pseudo is None and errors == {}
    assert np.allclose(np.exp(log_probs), 0.5, rtol=1e-12)
    assert s.releases_by_mechanism() == {("posterior", True): 1} and len(s.releases()) == 1
    s.close()
    (releases / "r9.npz").write_bytes(b"never committed")  # a crash between the file and the commit
    if store:  # a shared database: removed once older than the grace (another replica may be about to commit it)
        old = time.time() - ORPHAN_GRACE_SECONDS - 60
        os.utime(releases / "r9.npz", (old, old))
    s = open_store()
    assert sorted(p.name for p in releases.iterdir()) == ["r1.npz"] and s.counts()["releases"] == 1


def test_data_dependent_releases_are_counted_not_charged(open_store):
    s = open_store()
    for rid in ("d1", "d2"):
        _release(s, rid, charge=None, data_dependent_cap=2)
    assert s.spent() == {3: Budget(0.0), 4: Budget(0.0)}
    assert s.data_dependent_releases([3, 4, 5]) == {3: 2, 4: 2, 5: 0}
    with pytest.raises(FailedPrecondition, match="data-dependent release"):
        _release(s, "d3", charge=None, data_dependent_cap=2)


def test_noisy_counts_are_kept_and_charged(open_store):
    s = open_store()
    assert s.noisy_count(1, 2) is None
    s.add_noisy_count(1, 2, 41.5, 2.0, Budget(0.5, 0.0), Budget(1.0, 0.0))
    value, scale, eps, _ = s.noisy_count(1, 2)
    assert (value, scale, eps) == (41.5, 2.0, 0.5)
    assert s.spent() == {1: Budget(0.5, 0.0), 2: Budget(0.5, 0.0)}
    with pytest.raises(FailedPrecondition, match="budget exhausted"):
        s.add_noisy_count(2, 2, 3.0, 1.0, Budget(0.75, 0.0), Budget(1.0, 0.0))
    assert s.noisy_count(2, 2) is None and s.spent([2]) == {2: Budget(0.5, 0.0)}


def test_exports_are_recorded_and_close_their_windows(open_store):
    s = open_store()
    s.add_batch("b1", [b"x" * 16], _items, [], DAY, windows=(7, 7))
    at = s.add_export("e1", "exporter", 7, 7, 1, '{"g": 1}', batches=1)
    assert s.exports() == [("e1", "exporter", at, 7, 7, 1)]
    with pytest.raises(FailedPrecondition) as late:
        s.add_batch("b2", [b"y" * 16], _items, [], DAY, windows=(7, 7))
    assert late.value.error_reason == ErrorReason.WINDOW_EXPORTED and not s.has_batch("b2")


def test_words_for_export_are_kept_then_purged(open_store, tmp_path):
    s = open_store(keep_words=True)
    s.add_batch("b1", [b"x" * 16], lambda keep: report_items([[["the", "dog"]]], 2), [], DAY, windows=(3, 3))
    ((*_, words),) = s.export_batches(3, 3)
    assert words is not None and (tmp_path / "state" / "words" / words).is_file()
    assert s.purge_words(before_window=3) == 0 and s.purge_words(before_window=4) == 1
    assert not (tmp_path / "state" / "words" / words).exists() and s.export_batches(3, 3)[0][4] is None


def test_the_privacy_unit_is_recorded_once(open_store):
    s = open_store()
    s.keep_unit(UNIT)
    s.keep_unit(dict(UNIT))
    with pytest.raises(PrivacyUnitChanged, match="window_seconds = 86400"):
        s.keep_unit({**UNIT, "window_seconds": 3600.0})
    assert set(UNIT) == set(UNIT_FIELDS)


def test_the_first_window_of_reports_at_the_channels_epsilon_is_recorded(open_store):
    """Issue 32 item 2: a fresh state has every report at the ε it takes (None: every window); once it holds
    batches, taking another exact ε (or turning exactness on) starts from the window after the current one, which a
    restart with the same ε keeps; with no exact ε (None) there is no such window."""
    s = open_store()
    assert s.keep_report_epsilon(8.0, 10) is None and s.keep_report_epsilon(8.0, 11) is None  # fresh: every window
    s.add_batch("b1", [b"r1" * 8], _items, [], DAY)
    assert s.keep_report_epsilon(8.0, 12) is None  # the same ε: its reports were all at 8
    assert s.keep_report_epsilon(5.0, 12) == 13  # another ε: window 12 may hold reports at 8
    assert s.keep_report_epsilon(5.0, 20) == 13  # a restart with the same ε keeps it
    assert s.keep_report_epsilon(None, 21) is None  # no exact ε: no channel to keep apart
    assert s.keep_report_epsilon(5.0, 22) == 23  # exact again: reports at any ε were taken until now
    s.close()
    assert open_store().keep_report_epsilon(5.0, 30) == 23  # recorded in the database


def test_the_journal_puts_back_charges_a_restored_database_lacks(open_store, tmp_path):
    s = open_store()
    _release(s, "r1", "q1")
    s.add_export("e1", "exporter", 3, 3, 0, "{}")
    kept = journal.read(tmp_path / "state" / journal.JOURNAL_NAME)
    assert [c.release_id for c in kept] == ["r1"]
    # As after restoring a database from before the release and the export (its file is gone with it):
    s.database.script("DELETE FROM window_ledger; DELETE FROM release_requests; DELETE FROM exports")
    s.database.execute("DELETE FROM releases")
    s.close()
    s = open_store()
    assert s.spent() == {3: Budget(1.0, 0.0), 4: Budget(1.0, 0.0)}
    assert s.release_for_request("q1", "{}") == "r1" and [e[0] for e in s.exports()] == ["e1"]
    assert journal.reconcile(s.database, tmp_path / "state") == 0  # nothing twice


def test_the_schema_is_versioned_and_a_newer_one_refused(open_store):
    s = open_store()
    steps = schema.steps(s.database)
    newest = max(m.version for m in steps)
    versions = [int(r[0]) for r in s.database.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, newest + 1))
    assert s.database.migrate(schema.NAME, steps) == newest  # applied once: nothing again
    future = Migration(newest + 1, "a later version's step", lambda db: db.execute("CREATE TABLE later (x INTEGER)"))
    assert s.database.migrate(schema.NAME, (*steps, future)) == newest + 1
    s.close()
    with pytest.raises(FailedPrecondition, match=f"schema version {newest + 1}, newer than this program's"):
        open_store()


def test_two_replicas_race_for_the_last_epsilon_and_one_wins(open_store, store, tmp_path):
    """Replicas are stores over one database and one shared directory, each used by one thread (on SQLite they share
    the state directory, whose database is the one they can share): six releases that each fit the budget alone and
    not with another, started together, give exactly one release and one charge."""
    stores = [open_store("state" if not store else f"replica{i}", shared_dir=tmp_path / "shared") for i in range(6)]
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def release(i: int) -> None:
        barrier.wait()
        try:
            outcomes.append(_release(stores[i], f"r{i}", windows=[3], charge=Budget(0.6, 0.0), limit=Budget(1.0)))
        except FailedPrecondition as exc:
            assert exc.error_reason == ErrorReason.BUDGET_EXHAUSTED
            outcomes.append("refused")

    threads = [threading.Thread(target=release, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 6 and outcomes.count("refused") == 5
    assert stores[0].spent([3]) == {3: Budget(0.6, 0.0)} == stores[1].spent([3])
    assert stores[1].counts()["releases"] == 1


def test_two_replicas_with_one_request_id_or_one_batch_store_it_once(open_store, store, tmp_path):
    stores = [open_store("state" if not store else f"replica{i}", shared_dir=tmp_path / "shared") for i in range(4)]
    barrier = threading.Barrier(4)
    got: list[object] = []

    def act(i: int) -> None:
        barrier.wait()
        if i < 2:
            got.append(_release(stores[i], f"r{i}", "same-request"))
        else:
            got.append(stores[i].add_batch("b1", [os.urandom(16)], _items, [], DAY).duplicate)

    threads = [threading.Thread(target=act, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [g for g in got if isinstance(g, str)]
    assert len(ids) == 2 and ids[0] == ids[1]  # the retry on the other replica returns the same release
    assert sorted(g for g in got if isinstance(g, bool)) == [False, True]
    assert stores[0].spent() == {3: Budget(1.0, 0.0), 4: Budget(1.0, 0.0)}
    assert stores[0].counts() == {"batches": 1, "reports": 1, "releases": 1, "quarantined": 0}


def _tables(db) -> dict[str, set[str]]:
    """Every table of ``db`` with its columns, PostgreSQL's ``rowid`` left out (SQLite's is implicit)."""
    return {t: set(db.columns(t)) - {"rowid"} for t in db.tables()}


def test_postgresql_holds_the_tables_and_columns_sqlite_holds(tmp_path, postgres_url):
    """Nothing more on PostgreSQL than in curator.sqlite (issue 35: privacy must not weaken)."""
    sqlite, pg = CuratorStore(tmp_path / "a"), CuratorStore(tmp_path / "b", store=postgres_url)
    try:
        assert _tables(pg.database) == _tables(sqlite.database)
        assert set(schema.TABLES) | {"probe", "schema_version"} == set(_tables(pg.database))
    finally:
        sqlite.close()
        pg.close()
