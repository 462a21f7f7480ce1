"""What the curator's state directory holds and what it was created for (issue 34): the privacy unit it
records at its first start and refuses to change."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import time

import grpc
import pytest
from lac_testkit import DEPLOYMENT, batch_privacy, content

from lac.common import envelope
from lac.common.errors import FailedPrecondition
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2
from lac.curator.service import lifecycle

CLOSED = DEPLOYMENT.window(time.time()) - 3  # a closed, settled window (the default window is a day)


def _ingest(cur, key, batch_id: str, n: int, window: int | None = None, deployment=DEPLOYMENT) -> None:
    with grpc.insecure_channel(cur.address) as ch:
        reply = curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id=batch_id,
                reports=[envelope.seal(content(["the", "dog", "sleeps"]), key) for _ in range(n)],
                privacy=batch_privacy(n, deployment, window=window),
            ),
            timeout=30,
        )
    assert reply.accepted == n


# -- item 12: the privacy unit is recorded at the first start ------------------------------------------


def test_a_restart_with_another_privacy_unit_is_refused(start_curator, curator_public_key, tmp_path):
    """A curator restarted with another window_seconds read its stored window ids in the new unit (every
    release then failed with INVALID_ARGUMENT); now it does not start, and says what to do."""
    state = tmp_path / "state"
    cur = start_curator(state_dir=state)
    _ingest(cur, curator_public_key, "b1", 3, CLOSED)
    cur.stop()
    for change in (
        {"window_seconds": 3600.0},
        {"reports_per_window": 2},
        {"period_days": 7.0},
        {"max_windows_per_client_per_period": 5},
    ):
        with pytest.raises(FailedPrecondition) as exc:
            start_curator(state_dir=state, **change)
        text = str(exc.value)
        assert "was created with" in text and "fresh --state-dir" in text, text
    again = start_curator(state_dir=state)  # the recorded unit still starts (the lock was let go)
    with grpc.insecure_channel(again.address) as ch:
        budget = curator_pb2_grpc.CuratorStub(ch).GetBudget(curator_pb2.BudgetRequest(), timeout=30)
    assert CLOSED in [w.window for w in budget.windows]


def test_a_state_from_before_the_record_is_checked_against_its_batches(start_curator, curator_public_key, tmp_path):
    state = tmp_path / "state"
    cur = start_curator(state_dir=state)
    _ingest(cur, curator_public_key, "b1", 2, CLOSED)
    cur.stop()
    db = sqlite3.connect(state / "curator.sqlite")
    db.execute("DELETE FROM meta")  # as an earlier version left it
    db.commit()
    db.close()
    with pytest.raises(FailedPrecondition, match="window_seconds = 86400"):
        start_curator(state_dir=state, window_seconds=3600.0)
    start_curator(state_dir=state)


@pytest.mark.slow  # a real `lac curator serve` process
def test_serve_with_another_privacy_unit_fails_in_one_line(start_curator, curator_public_key, tmp_path, public_corpus):
    state = tmp_path / "state"
    cur = start_curator(state_dir=state)
    _ingest(cur, curator_public_key, "b1", 1, CLOSED)
    cur.stop()
    args = [sys.executable, "-m", "lac.common", "curator", "serve", "--host", "127.0.0.1", "--port", "0"]
    flags = ["--state-dir", str(state), "--public-corpus", str(public_corpus), "--vocab-min-count", "1"]
    flags += ["--insecure", "--ingest-workers", "1", "--window-seconds", "3600"]
    proc = subprocess.Popen([*args, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the curator started with another window_seconds: {err[-2000:]}")
    assert proc.returncode == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("lac curator serve: error: ") and "window_seconds = 86400" in line, line
    assert "window_seconds = 3600" in line and "fresh --state-dir" in line, line


# -- item 7: a quarantined report's content reaches neither the logs nor the quarantine table --------------

SECRET = "zqxjsecret"  # in every word of the bad reports below: no log line and no stored byte may hold it


def test_quarantine_names_the_rule_never_the_content(start_curator, curator_public_key, caplog, tmp_path, monkeypatch):
    from lac.common.logs import TEXT_FORMAT, JsonFormatter
    from lac.curator.store.store import CuratorStore

    state = tmp_path / "state"
    cur = start_curator(state_dir=state)
    bad = [
        content([f"{SECRET}a", f"{SECRET} b"]),  # invalid: whitespace in a token
        content([f"{SECRET}c"], [f"{SECRET}d" * 8]),  # invalid: a token longer than max_token_chars (64)
        content([f"{SECRET}e", "<unk>"]),  # invalid: a reserved token
        content([f"{SECRET}f"], embedding=f"{SECRET}-embedding"),  # embedding_mismatch
        content([f"{SECRET}g"], epsilon=16.0),  # epsilon_too_large
        content([f"{SECRET}h"], mechanism="knn-truncated"),  # mechanism_not_allowed
        content([f"{SECRET}i"] * 41),  # too_many_words
    ]
    payloads = [envelope.seal(c, curator_public_key) for c in bad]
    original = envelope.open_payload

    def buggy_open(sealed, *args, **kw):  # a bug whose exception quotes what it was reading
        if sealed.key_id == "boom":
            raise RuntimeError(f"cannot read {SECRET}j")
        return original(sealed, *args, **kw)

    monkeypatch.setattr(envelope, "open_payload", buggy_open)
    payloads.append(reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="boom", data=b"x"))
    good = envelope.seal(content(["the", "dog"]), curator_public_key)
    with caplog.at_level("INFO"), grpc.insecure_channel(cur.address) as ch:
        reply = curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="b", reports=[good, *payloads], privacy=batch_privacy(len(payloads) + 1, window=CLOSED)
            ),
            timeout=30,
        )
    assert (reply.accepted, reply.rejected) == (1, len(payloads))
    lines = [f(r) for r in caplog.records for f in (logging.Formatter(TEXT_FORMAT).format, JsonFormatter().format)]
    assert any("quarantined" in line for line in lines)
    leaked = [line for line in lines if SECRET in line]
    assert not leaked, leaked
    cur.stop()
    store = CuratorStore(state)
    rows = store.quarantine()
    store.close()
    details = {reason: detail for _, reason, detail, _ in rows}
    assert not [d for d in details.values() if SECRET in d], details
    assert "token 2 of sentence 1" in details["invalid"] or "token 1 of sentence 2" in details["invalid"], details
    assert "characters" in details["invalid"] and "embedding" in details["embedding_mismatch"], details
    # an opened report's bytes are its words to this curator's key: not kept; an unopened one's are, for diagnosis
    assert {reason: bool(sealed) for _, reason, _, sealed in rows if reason != "invalid"} == {
        "embedding_mismatch": False,
        "epsilon_too_large": False,
        "mechanism_not_allowed": False,
        "too_many_words": False,
        "internal": True,
    }
    for path in state.rglob("*"):  # nothing in the state directory holds a quarantined report's words
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# -- item 6: a report's words are kept only for export ---------------------------------------------------

WORDS = ["zqxjalpha", "zqxjbravo", "zqxjcharlie", "zqxjdelta", "zqxjecho"]  # one report's words, in order


def _holding(state, words: list[str]) -> list[str]:
    """The files of the state directory that hold the report ``words`` verbatim: as a list of words or as
    text of more words than any n-gram has (Parquet files decoded, every other file as bytes)."""
    import pyarrow.parquet as pq

    text = " ".join(words)

    def holds(value) -> bool:
        if isinstance(value, list):
            return value == words or any(holds(v) for v in value)
        if isinstance(value, dict):
            return any(holds(v) for v in value.values())
        return isinstance(value, str) and text in value

    found = []
    for path in sorted(p for p in state.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            if any(holds(row) for row in pq.read_table(path).to_pylist()):
                found.append(str(path.relative_to(state)))
        elif text.encode() in path.read_bytes():
            found.append(str(path.relative_to(state)))
    return found


def _seal_words(key, n: int = 3) -> list[reports_pb2.SealedPayload]:
    return [envelope.seal(content(WORDS), key) for _ in range(n)]


def test_no_report_words_at_rest_with_export_off(start_curator, curator_public_key, tmp_path):
    """Issue 34 item 6: every report's words were stored verbatim in its segment, export on or off. With export
    off (the default) the state directory holds each report's n-grams with their counts (what releases read),
    never its words; the release reads the same counts."""
    state = tmp_path / "state"
    cur = start_curator(state_dir=state)
    with grpc.insecure_channel(cur.address) as ch:
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="b", reports=_seal_words(curator_public_key), privacy=batch_privacy(3, window=CLOSED)
            ),
            timeout=30,
        )
        r = curator_pb2_grpc.CuratorStub(ch).Release(
            curator_pb2.ReleaseRequest(mechanism="laplace", epsilon=1), timeout=60
        )
    assert r.n_reports == 3
    cur.stop()
    assert _holding(state, WORDS) == []
    assert not (state / "words").exists() or not any((state / "words").rglob("*.parquet"))


def test_words_are_kept_for_export_only_then_deleted(start_curator, curator_public_key, tmp_path):
    """With export on, each batch's words are kept in state_dir/words until export_retention_days after its window
    closes, then deleted (its window can no longer be exported); backups hold none; a start with export off
    deletes them all."""
    from lac.analyst.client import CuratorClient
    from lac.analyst.client import FailedPrecondition as Refused
    from lac.curator.service.backup import backup

    state = tmp_path / "state"
    cur = start_curator(state_dir=state, export_identities="exporter", export_retention_days=5.0)
    with grpc.insecure_channel(cur.address) as ch:
        for batch_id, window in (("recent", CLOSED), ("old", CLOSED - 10)):
            curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
                curator_pb2.IngestBatchRequest(
                    batch_id=batch_id, reports=_seal_words(curator_public_key), privacy=batch_privacy(3, window=window)
                ),
                timeout=30,
            )
    assert [p.split("/")[0] for p in _holding(state, WORDS)] == ["words", "words"]
    for path in (state / "words", *(state / "words").rglob("*")):  # private, as the rest of the state
        assert path.stat().st_mode & 0o077 == 0, path
    assert cur.call(lifecycle.purge_words(cur.curator)) == 1  # the old window's: closed more than 5 days ago
    (kept,) = _holding(state, WORDS)
    assert f"window={CLOSED}/" in kept
    with CuratorClient(cur.address, insecure=True) as c:  # insecure: every caller holds every role
        assert c.export_reports(CLOSED).texts() == [" ".join(WORDS)] * 3
        with pytest.raises(Refused, match="not kept"):
            c.export_reports(CLOSED - 10)
    backup(state, tmp_path / "backup")
    assert _holding(tmp_path / "backup", WORDS) == []
    cur.stop()
    start_curator(state_dir=state).stop()  # export off: every words file goes at start
    assert _holding(state, WORDS) == []


def test_migrate_segments_removes_the_words_earlier_segments_kept(tmp_path, capsys, caplog):
    """Segments of earlier versions have a words column: the start warns, migrate-segments rewrites them
    without it (same n-grams), and the warning stops."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lac_testkit import run_lac

    from lac.curator.base.ngrams import report_items
    from lac.curator.store import segments as seg
    from lac.curator.store.store import CuratorStore

    store = CuratorStore(tmp_path)
    store.add_batch("b1", [b"r" * 16], lambda keep: report_items([[WORDS]], 3), [], 86400.0)
    (path,) = store.segment_paths()
    store.database.script("ALTER TABLE batches DROP COLUMN words; DROP TABLE schema_version")  # as an earlier
    # version's database (before the schema's numbered steps)
    store.close()
    t = pq.read_table(path)  # and its segment, with the report's words on its first row
    words = pa.array([WORDS] + [None] * (t.num_rows - 1), pa.list_(pa.string()))
    pq.write_table(t.append_column(seg.WORDS, words).replace_schema_metadata(t.schema.metadata), path)
    assert _holding(tmp_path, WORDS) == [str(path.relative_to(tmp_path))]
    store = CuratorStore(tmp_path)
    assert store.segment_words_unchecked()
    store.close()
    code, out, err = run_lac(capsys, "curator", "migrate-segments", "--state-dir", str(tmp_path))
    assert code == 0 and "removed the reports' words from 1 segment(s)" in out, err
    assert _holding(tmp_path, WORDS) == [] and not seg.has_words(path)
    assert seg.read(path).n_reports == 1 and seg.metadata(path)["batch_id"] == "b1"
    store = CuratorStore(tmp_path)
    assert not store.segment_words_unchecked()
    store.close()
