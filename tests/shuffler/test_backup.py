"""``lac shuffler backup`` on a live shuffler and ``lac shuffler restore`` into a fresh state directory."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading

import grpc
import pytest
from lac_testkit import run_lac
from shuffler_testkit import report, tag_of, wait_for

from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_clients


def _lac_process(*args: str) -> subprocess.CompletedProcess:
    """``lac shuffler ARGS`` as its own process, as an operator runs it next to the live shuffler."""
    return subprocess.run(
        [sys.executable, "-m", "lac.common", "shuffler", *args], capture_output=True, text=True, timeout=120
    )


def _status(address):
    with grpc.insecure_channel(address) as ch:
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)


def _submit(address, reports, token):
    with grpc.insecure_channel(address) as ch:
        return (
            shuffler_pb2_grpc.ShufflerStub(ch)
            .Submit(
                shuffler_pb2.SubmitRequest(reports=reports),
                timeout=10,
                metadata=(("authorization", f"Bearer {token}"),),
            )
            .acks
        )


def _same(a: shuffler_pb2.ShufflerStatus, b: shuffler_pb2.ShufflerStatus) -> None:
    assert (a.buffered_reports, a.buffered_clients, a.batches_pending, a.batches_forwarded, a.reports_forwarded) == (
        b.buffered_reports,
        b.buffered_clients,
        b.batches_pending,
        b.batches_forwarded,
        b.reports_forwarded,
    )
    assert dict(a.counters) == dict(b.counters) and dict(a.rejects) == dict(b.rejects)
    assert [x.batch_id for x in a.recent_batches] == [x.batch_id for x in b.recent_batches]


def test_online_backup_restores_the_same_state_and_delivers_the_same_reports(start_shuffler, sink, tmp_path, capsys):
    sink.down = True  # released batches stay pending in the log
    state = tmp_path / "live"
    tokens = add_clients(state / "clients.tokens", [f"c{i}" for i in range(300)])  # one report per client
    a = start_shuffler(sink.address, auth="token", state_dir=state, min_batch=10, forward_retry_max_seconds=0.2)
    acked: list = []

    # 1. A backup taken while clients submit is one consistent snapshot: every report the copy counts as
    #    accepted is in it, either buffered or in a released batch.
    stop = threading.Event()

    def submitter(mine):
        for token in mine:
            if stop.is_set():
                break
            chunk = [report()]
            _submit(a.address, chunk, token)
            acked.extend(chunk)

    threads = [threading.Thread(target=submitter, args=(tokens[i:200:4],)) for i in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) > 40)
    r = _lac_process("backup", str(tmp_path / "during"), "--state-dir", str(state))
    stop.set()
    for t in threads:
        t.join(10)
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "during" / "shuffler.sqlite")
    accepted = db.execute("SELECT value FROM counters WHERE name = 'accepted'").fetchone()[0]
    # a released report's row stays in the buffer table (held by its batch) until the curator takes the batch
    rows = db.execute("SELECT COUNT(*) FROM buffer").fetchone()[0]
    released = db.execute("SELECT COALESCE(SUM(n), 0) FROM batches WHERE seqs IS NOT NULL").fetchone()[0]
    db.close()
    assert accepted == rows > 0 and released <= rows

    # 2. Quiet now (A still serving): a rejected call, and reports of 30 distinct clients, so some are
    #    released into batches the curator has not taken and some are buffered.
    with pytest.raises(grpc.RpcError):
        _submit(a.address, [shuffler_pb2.ClientReport(idempotency_id=b"short")], tokens[0])
    for i, token in enumerate(tokens[200:226]):
        if i == 25 and _status(a.address).buffered_reports:
            break  # a 26th report only if the last release took everything buffered
        chunk = [report()]
        _submit(a.address, chunk, token)
        acked.append(chunk[0])
    before = _status(a.address)
    assert before.batches_pending >= 1 and before.buffered_reports >= 1 and before.rejects
    code, _, err = run_lac(capsys, "shuffler", "backup", str(tmp_path / "backup"), "--state-dir", str(state))
    assert code == 0, err
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["buffered_reports"] == before.buffered_reports and manifest["tokens"]
    assert oct((tmp_path / "backup").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "backup" / "shuffler.sqlite").stat().st_mode & 0o777) == "0o600"
    a.stop()  # the old machine is gone

    fresh = tmp_path / "fresh"
    restore = ["shuffler", "restore", str(tmp_path / "backup"), "--state-dir", str(fresh)]
    code, _, err = run_lac(capsys, *restore, "--client-key", str(state / "client.key"))  # kept apart from backups
    assert code == 0, err
    code, _, err = run_lac(capsys, *restore)
    assert code == 2, err  # no overwrite
    b = start_shuffler(sink.address, auth="token", state_dir=fresh, min_batch=10, forward_retry_max_seconds=0.2)
    _same(before, _status(b.address))
    # another log than the one backed up (which may still run): its own store_id, so the SDK never passes a call
    # that may be stored in one to the other as if they were replicas of one log
    assert _store_id(fresh) and _store_id(fresh) != _store_id(state)

    # 3. The curator returns: the restored shuffler delivers the pending batches and, once the
    #    threshold is reached again, the buffered reports: each acknowledged report exactly once.
    sink.down = False
    acked_tags = {tag_of(r.payload) for r in acked}
    for token in tokens[226:241]:  # the tokens came back too
        chunk = [report()]
        _submit(b.address, chunk, token)
        acked_tags.add(tag_of(chunk[0].payload))
    wait_for(lambda: _status(b.address).batches_pending == 0 and _status(b.address).buffered_reports < 10, 30)
    left = _status(b.address).buffered_reports
    got = sink.tags()
    assert len(got) == len(set(got))
    assert set(got) <= acked_tags and len(acked_tags - set(got)) == left


def _store_id(state_dir) -> bytes:
    db = sqlite3.connect(state_dir / "shuffler.sqlite")
    try:
        return db.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()[0]
    finally:
        db.close()


def test_the_client_key_stays_out_of_the_report_log_and_its_backups(tmp_path, capsys):
    """Issue 34.8: the key that turns a client id into the hash the log stores is a file of its own
    (STATE_DIR/client.key, 0600), in neither the database nor a backup, so a backup and its tokens file (the ids)
    cannot tell whose hashes the log holds. A restore needs the key: the target's own, --client-key FILE, or
    --new-client-key, which forgets every client's quota and period-cap use."""
    import os

    from lac.shuffler.reportlog import OVER_QUOTA, ClientKeyError, ReportLog

    state = tmp_path / "live"
    log = ReportLog(state)
    alice = log.client_key("token:alice")

    def put(log, client):
        return log.append_groups(
            [([(os.urandom(16), None, b"x")], client)], 5, 1, 1 << 30, period_cap=2, period_windows=10
        )[0]

    assert put(log, alice) == [True]
    log.close()
    key = (state / "client.key").read_bytes()
    assert len(key) == 32 and oct((state / "client.key").stat().st_mode & 0o777) == "0o600"
    for f in state.iterdir():
        if f.name != "client.key":
            assert key not in f.read_bytes(), f.name
    code, _, err = run_lac(capsys, "shuffler", "backup", str(tmp_path / "backup"), "--state-dir", str(state))
    assert code == 0, err
    for f in (tmp_path / "backup").iterdir():
        assert key not in f.read_bytes(), f.name

    other = tmp_path / "other"
    code, _, err = run_lac(capsys, "shuffler", "restore", str(tmp_path / "backup"), "--state-dir", str(other))
    assert code == 2 and "--client-key" in err and "--new-client-key" in err, err
    assert not (other / "shuffler.sqlite").exists()
    code, _, err = run_lac(
        capsys,
        "shuffler",
        "restore",
        str(tmp_path / "backup"),
        "--state-dir",
        str(other),
        "--client-key",
        str(state / "client.key"),
    )
    assert code == 0, err
    log = ReportLog(other)
    assert log.client_key("token:alice") == alice and put(log, alice) == OVER_QUOTA  # its quota use kept
    log.close()

    third = tmp_path / "third"
    code, _, err = run_lac(
        capsys, "shuffler", "restore", str(tmp_path / "backup"), "--state-dir", str(third), "--new-client-key"
    )
    assert code == 0, err
    log = ReportLog(third)
    assert log.client_key("token:alice") != alice and put(log, log.client_key("token:alice")) == [True]
    assert log.buffered() == 2  # the restored report and the new one
    log.close()

    (third / "client.key").write_bytes(os.urandom(32))  # another key than the one the log's hashes were made with
    with pytest.raises(ClientKeyError, match="client.key"):
        ReportLog(third)
    (third / "client.key").unlink()
    with pytest.raises(ClientKeyError, match="client.key"):
        ReportLog(third)


def test_a_log_that_kept_its_client_key_inside_moves_it_out(tmp_path):
    """A report log written before issue 34 kept the key in its meta table: at the next start it moves to
    client.key and leaves no copy in the database (its pages are rewritten), the hashes unchanged."""
    import sqlite3

    from lac.shuffler.reportlog import ReportLog

    log = ReportLog(tmp_path)
    alice = log.client_key("token:alice")
    log.close()
    key = (tmp_path / "client.key").read_bytes()
    (tmp_path / "client.key").unlink()
    db = sqlite3.connect(tmp_path / "shuffler.sqlite")
    db.execute("DELETE FROM meta WHERE name = 'client_key_id'")
    db.execute("INSERT INTO meta VALUES ('client_key', ?)", (key,))
    db.commit()
    db.close()
    assert key in (tmp_path / "shuffler.sqlite").read_bytes()
    log = ReportLog(tmp_path)
    assert log.client_key("token:alice") == alice and (tmp_path / "client.key").read_bytes() == key
    log.close()
    for f in tmp_path.iterdir():
        if f.name != "client.key":
            assert key not in f.read_bytes(), f.name
