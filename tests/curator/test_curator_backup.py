"""``lac curator backup`` of a live curator and ``lac curator restore`` into a fresh state directory:
the same status, ledger, releases (records and released values) and stored reports."""

from __future__ import annotations

import json
import random
import threading

import pytest
from curator_testkit import Stubs, batch
from lac_testkit import batch_privacy, content, wait_until

from lac.common import envelope
from lac.common.v1 import curator_pb2
from lac.curator.store import segments as seg
from lac.curator.store.store import CuratorStore


def _lac(capsys, *argv) -> tuple[int, str]:
    from lac.common.cli import main

    with pytest.raises(SystemExit) as e:
        main(["curator", *argv])
    out = capsys.readouterr()
    return e.value.code, out.out + out.err


def _view(address: str) -> dict:
    """Everything an operator sees of a curator, releases' values included."""
    with Stubs(address) as s:
        status = s.status()
        releases = s.query.ListReleases(curator_pb2.ListReleasesRequest(), timeout=10).releases
        values = {
            r.release_id: s.query.GetRelease(curator_pb2.GetReleaseRequest(release_id=r.release_id), timeout=10)
            for r in releases
        }
        budget = s.query.GetBudget(curator_pb2.BudgetRequest(), timeout=10)
    return {"status": status, "releases": list(releases), "values": values, "budget": budget}


def test_backup_of_a_live_curator_restores_the_same_state(start_curator, tmp_path, capsys):
    rng = random.Random(7)
    live = tmp_path / "live"
    cur = start_curator(state_dir=live, allow_plaintext_payloads=True, budget_epsilon=5.0)
    with Stubs(cur.address) as s:
        # 1. A backup taken while batches arrive is one consistent snapshot: every batch it holds has its segment.
        stop, sent = threading.Event(), []

        def shuffler():
            with Stubs(cur.address) as mine:
                while not stop.is_set():
                    mine.ingest.IngestBatch(batch(30, rng), timeout=30)
                    sent.append(1)

        t = threading.Thread(target=shuffler)
        t.start()
        wait_until(lambda: len(sent) >= 3)
        code, out = _lac(capsys, "backup", str(tmp_path / "during"), "--state-dir", str(live))
        stop.set()
        t.join(30)
        assert code == 0, out
        copy = tmp_path / "restored-during"
        assert _lac(capsys, "restore", str(tmp_path / "during"), "--state-dir", str(copy))[0] == 0
        store = CuratorStore(copy)
        counts = store.counts()
        assert 3 <= counts["batches"] <= len(sent) + 1
        assert sum(seg.read(p).n_reports for p in store.segment_paths()) == counts["reports"] == 30 * counts["batches"]
        store.close()

        # 2. Quiet: a quarantined report, releases (one with a request id), a DP count, then the backup.
        bad = envelope.seal_insecure(content(["x"], epsilon=1e9))
        s.ingest.IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="with-bad", reports=[bad] + list(batch(5, rng).reports), privacy=batch_privacy(6)
            ),
            timeout=30,
        )
        s.query.Release(curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-6, request_id="r-1"), timeout=60)
        s.query.Release(curator_pb2.ReleaseRequest(epsilon=0.5, mechanism="laplace"), timeout=60)
        before = _view(cur.address)
        assert before["status"].quarantined == 1 and len(before["releases"]) == 2
        code, out = _lac(capsys, "backup", str(tmp_path / "backup"), "--state-dir", str(live))
        assert code == 0 and "2 releases" in out, out
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["releases"] == 2 and len(manifest["files"]) == before["status"].batches + 2
    assert oct((tmp_path / "backup").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "backup" / "curator.sqlite").stat().st_mode & 0o777) == "0o600"
    assert _lac(capsys, "backup", str(tmp_path / "backup"), "--state-dir", str(live))[0] != 0  # no overwrite
    cur.stop()  # the old machine is gone

    # 3. Restore into a fresh directory: the same status, ledger and releases; retries still idempotent.
    fresh = tmp_path / "fresh"
    code, out = _lac(capsys, "restore", str(tmp_path / "backup"), "--state-dir", str(fresh))
    assert code == 0, out
    assert _lac(capsys, "restore", str(tmp_path / "backup"), "--state-dir", str(fresh))[0] != 0  # refuses
    again = start_curator(state_dir=fresh, allow_plaintext_payloads=True, budget_epsilon=5.0)
    after = _view(again.address)
    assert after == before
    with Stubs(again.address) as s:
        same = s.query.Release(curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-6, request_id="r-1"), timeout=60)
        assert same.release_id == before["releases"][0].release_id
        assert s.ingest.IngestBatch(curator_pb2.IngestBatchRequest(batch_id="with-bad"), timeout=10).duplicate
    again.stop()

    # 4. A damaged backup is refused before anything is installed.
    victim = tmp_path / "backup" / next(iter(manifest["files"]))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    code, out = _lac(capsys, "restore", str(tmp_path / "backup"), "--state-dir", str(tmp_path / "other"))
    assert code != 0 and "SHA-256" in out
    assert not (tmp_path / "other" / "curator.sqlite").exists()


def test_restore_refuses_a_manifest_naming_files_outside_the_state_directory(tmp_path):
    from lac.common.backup import sha256_file, write_manifest
    from lac.curator.service.backup import FORMAT, restore

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "curator.sqlite").write_bytes(b"")
    write_manifest(
        tmp_path / "b",
        {
            "format": FORMAT,
            "database": "curator.sqlite",
            "database_sha256": sha256_file(tmp_path / "b" / "curator.sqlite"),
            "files": {"../escape": "0" * 64},
        },
    )
    with pytest.raises(ValueError, match="outside the state directory"):
        restore(tmp_path / "b", tmp_path / "state")


def _spent(address: str) -> dict[int, float]:
    with Stubs(address) as s:
        budget = s.query.GetBudget(curator_pb2.BudgetRequest(), timeout=10)
    return {w.window: round(w.spent_epsilon, 9) for w in budget.windows if w.spent_epsilon}


def test_restoring_an_older_backup_keeps_the_budget_spent_since(start_curator, tmp_path, capsys, caplog):
    """Issue 23.7: restoring a backup older than the ledger's last charge handed budget back (ε 0.5 →
    0.0), and a retried release with its own request id then ran and charged again. The ledger
    journal keeps every charge: in place, after a crash between a commit and its journal line, and
    carried to another machine."""
    import grpc

    rng = random.Random(3)
    live = tmp_path / "live"
    cur = start_curator(state_dir=live, allow_plaintext_payloads=True, budget_epsilon=5.0)
    with Stubs(cur.address) as s:
        s.ingest.IngestBatch(batch(30, rng), timeout=30)
        assert _lac(capsys, "backup", str(tmp_path / "old"), "--state-dir", str(live))[0] == 0
        s.query.Release(curator_pb2.ReleaseRequest(epsilon=0.5, mechanism="laplace", request_id="after"), timeout=60)
    spent = _spent(cur.address)
    assert spent and set(spent.values()) == {0.5}
    cur.stop()

    # 1. In place: the restored database does not know the release; the journal puts its charge back.
    code, out = _lac(capsys, "restore", str(tmp_path / "old"), "--state-dir", str(live), "--force")
    assert code == 0 and "keeps the 1 charge(s) made after it" in out, out
    caplog.clear()
    again = start_curator(state_dir=live, allow_plaintext_payloads=True, budget_epsilon=5.0)
    assert _spent(again.address) == spent
    # its file goes, said as it is (issue 34 item 5: the warning called the charged release "never committed")
    removed = [r.getMessage() for r in caplog.records if "release file" in r.getMessage()]
    assert removed == [
        "removed 1 release file(s) of releases made after the backup this database was restored from: their "
        "records are gone, their charges stay in the ledger (kept by ledger.journal)"
    ], removed
    with Stubs(again.address) as s, pytest.raises(grpc.RpcError) as err:
        s.query.Release(curator_pb2.ReleaseRequest(epsilon=0.5, mechanism="laplace", request_id="after"), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "restored from an older backup" in err.value.details() and "nothing was spent" in err.value.details()
    assert _spent(again.address) == spent  # the retry charged nothing
    again.stop()

    # 2. A crash between a release's commit and its journal line: restore keeps the charge from the database.
    (live / "ledger.journal").unlink()
    code, out = _lac(capsys, "restore", str(tmp_path / "old"), "--state-dir", str(live), "--force")
    assert code == 0 and "keeps the 1 charge(s)" in out, out
    again = start_curator(state_dir=live, allow_plaintext_payloads=True, budget_epsilon=5.0)
    assert _spent(again.address) == spent
    again.stop()

    # 3. Another machine: without the old journal the restore says what is at stake; with it, nothing is lost.
    code, out = _lac(capsys, "restore", str(tmp_path / "old"), "--state-dir", str(tmp_path / "new"))
    assert code == 0 and "--carry-journal" in out, out
    code, out = _lac(
        capsys,
        "restore",
        str(tmp_path / "old"),
        "--state-dir",
        str(tmp_path / "newer"),
        "--carry-journal",
        str(live / "ledger.journal"),
    )
    assert code == 0 and "keeps the 1 charge(s)" in out, out
    moved = start_curator(state_dir=tmp_path / "newer", allow_plaintext_payloads=True, budget_epsilon=5.0)
    assert _spent(moved.address) == spent
    moved.stop()


def test_a_torn_journal_line_is_cut_and_its_charge_comes_back_from_the_database(tmp_path):
    from lac.common.privacy import Budget
    from lac.curator.store import journal

    store = CuratorStore(tmp_path)
    store.add_noisy_count(0, 2, 10.0, 1.0, Budget(0.01), Budget(1.0))
    store.close()
    path = tmp_path / journal.JOURNAL_NAME
    (line,) = journal.read(path)
    path.write_bytes(path.read_bytes()[:-7])  # the crash hit mid-line
    store = CuratorStore(tmp_path)
    assert journal.read(path) == [line]
    assert {w: round(b.epsilon, 9) for w, b in store.spent().items()} == {0: 0.01, 1: 0.01, 2: 0.01}
    store.close()


def test_restoring_an_older_backup_keeps_the_exports_made_since(tmp_path):
    """Exports are listed with the ledger (who, when, which windows): a restore of an older backup keeps the
    ones made after it, like charges, through the ledger journal."""
    from lac.curator.service.backup import backup, restore

    state = tmp_path / "state"
    store = CuratorStore(state)
    store.add_export("e-before", "exporter", 3, 4, 10, "{}")
    store.close()
    backup(state, tmp_path / "old")
    store = CuratorStore(state)
    store.add_export("e-after", "exporter", 5, 5, 7, "{}")
    store.close()
    restore(tmp_path / "old", state, force=True)
    store = CuratorStore(state)
    assert [(e[0], e[1], e[3], e[4], e[5]) for e in store.exports()] == [
        ("e-before", "exporter", 3, 4, 10),
        ("e-after", "exporter", 5, 5, 7),
    ]
    store.close()
