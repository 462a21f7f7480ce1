"""What the curator's state directory holds and what it was created for (issue 34): the privacy unit it
records at its first start and refuses to change."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import grpc
import pytest
from lac_testkit import DEPLOYMENT, batch_privacy, content

from lac.common import envelope
from lac.common.errors import FailedPrecondition
from lac.common.v1 import curator_pb2, curator_pb2_grpc

CLOSED = DEPLOYMENT.window(time.time()) - 2  # a closed window (the default window is a day)


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
