"""The ledger journal (``lac.curator.store.journal``): every charge and export kept in a file a restore never
replaces, read back exactly, a torn last line cut off, a damaged one refused, and reconciled with the database both
ways (a charge the database lacks put back once; one the journal lacks appended)."""

from __future__ import annotations

import logging
import stat

import pytest

from lac.common.privacy import Budget
from lac.curator.store import journal
from lac.curator.store.store import CuratorStore

CHARGE = journal.Charge("r1", 1000.5, 3, 4, 1.0, 1e-6, request_id="q1", spec='{"epsilon": 1.0}')
EXPORT = journal.ExportRecord("e1", "alice", 1001.0, 3, 3, 12, "{}")


def test_entries_are_read_back_as_appended(tmp_path):
    path = tmp_path / journal.JOURNAL_NAME
    assert journal.read(path) == []
    journal.append(path, [CHARGE, EXPORT])
    journal.append(path, [journal.Charge("r2", 1002.0, 5, 5, 0.0, 0.0, data_dependent=True)])
    assert [c.release_id for c in journal.read(path)] == ["r1", "r2"]  # charges only; the export is kept too
    assert journal.read(path)[0] == CHARGE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_torn_last_line_is_cut_off_and_a_damaged_one_refused(tmp_path, caplog):
    path = tmp_path / journal.JOURNAL_NAME
    journal.append(path, [CHARGE])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"release_id": "r2", "at"')  # a crash while appending
    with caplog.at_level(logging.WARNING, logger="lac.curator.store.journal"):
        assert journal.read(path) == [CHARGE]
    assert path.read_bytes() == whole and "cut off a torn last line" in caplog.text
    path.write_bytes(whole + b'{"not": "a charge"}\n')
    with pytest.raises(ValueError, match="line 2: not a ledger entry"):
        journal.read(path)


def test_an_append_that_fails_is_logged_not_raised(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="lac.curator.store.journal"):
        journal.append(tmp_path / "missing" / journal.JOURNAL_NAME, [CHARGE])  # committed in the database already
    assert "could not append 1 charge(s)" in caplog.text


def test_carry_adds_only_what_the_journal_lacks(tmp_path):
    old, state = tmp_path / "old.journal", tmp_path / "state"
    state.mkdir()
    journal.append(old, [CHARGE, EXPORT, journal.Charge("r2", 1002.0, 5, 5, 0.5, 0.0)])
    journal.append(state / journal.JOURNAL_NAME, [CHARGE])
    assert journal.carry(old, state) == 1  # r2 (the export comes along, not counted as a charge)
    assert journal.carry(old, state) == 0
    assert [c.release_id for c in journal.read(state / journal.JOURNAL_NAME)] == ["r1", "r2"]
    with pytest.raises(FileNotFoundError):
        journal.carry(tmp_path / "none", state)


def test_reconcile_puts_back_a_charge_the_database_lacks_once(tmp_path):
    state = tmp_path / "state"
    store = CuratorStore(state)
    try:
        journal.append(state / journal.JOURNAL_NAME, [CHARGE])  # as after restoring a database from before it
        assert journal.reconcile(store.database, state) == 1
        assert journal.reconcile(store.database, state) == 0  # nothing twice
        assert store.spent() == {3: Budget(1.0, 1e-6), 4: Budget(1.0, 1e-6)}
        assert store.release_for_request("q1", CHARGE.spec) == "r1"  # the retry is recognised
        assert journal.database_charges(store.database) == [CHARGE]
        assert journal.read(state / journal.JOURNAL_NAME) == [CHARGE]  # not appended again
        (state / journal.JOURNAL_NAME).unlink()  # the other way: the journal lost what the database holds
        assert journal.reconcile(store.database, state) == 0
        assert journal.read(state / journal.JOURNAL_NAME) == [CHARGE]
    finally:
        store.close()
