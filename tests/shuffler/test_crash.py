"""Crash safety: SIGKILL the shuffler process at random moments while clients submit.

Every acknowledged report must reach the curator exactly once (a batch re-sent after a
crash carries the same batch id, which the curator de-duplicates; so distinct batch ids
must hold distinct reports)."""

from __future__ import annotations

import os
import random
import threading
import time

import grpc
import pytest
from shuffler_testkit import ServeProc, report, tag_of, wait_for

from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc

KILLS = 22


def _submitter(address: str, todo: list, acked: list, stop: threading.Event) -> None:
    """Submit chunks of 20 reports until stopped or the server dies; acked chunks go to ``acked``."""
    with grpc.insecure_channel(address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        while not stop.is_set():
            chunk = todo[0] if todo else [report() for _ in range(20)]
            if not todo:
                todo.append(chunk)
            try:
                stub.Submit(shuffler_pb2.SubmitRequest(reports=chunk), timeout=5)
            except grpc.RpcError:
                return  # killed mid-call: the chunk stays in ``todo`` and is retried with the same ids
            acked.append(todo.pop(0))


@pytest.mark.slow
@pytest.mark.parametrize(
    "forwarding",
    [[], ["--max-batch-bytes", "1024", "--forward-in-flight", "3"]],
    ids=["one-batch-releases", "releases-cut-into-batches-3-in-flight"],
)
def test_sigkill_loses_no_acknowledged_report(tmp_path, sink, forwarding):
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    args = [
        "--state-dir",
        str(tmp_path / "state"),
        "--curator",
        sink.address,
        "--auth",
        "none",
        "--insecure",
        "--allow-plaintext-payloads",
        "--min-batch",
        "7",
        "--release-interval-seconds",
        "2",
        "--forward-retry-max-seconds",
        "0.2",
        *forwarding,
    ]
    todo: list = []
    acked: list = []
    for k in range(KILLS + 1):
        shuffler = ServeProc(args, tmp_path, timeout=120)
        stop = threading.Event()
        todos = [todo, [], []]  # chunks not acknowledged (in flight at a kill) are retried later, same ids
        threads = [threading.Thread(target=_submitter, args=(shuffler.address, t, acked, stop)) for t in todos]
        for t in threads:
            t.start()
        if k < KILLS:
            time.sleep(rng.uniform(0.05, 0.6))
            shuffler.kill()  # SIGKILL: no shutdown code runs
        else:
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(10)
        todo.extend(todos[1] + todos[2])
    # Last incarnation still running: drain every chunk in flight at a kill, then wait for delivery.
    with grpc.insecure_channel(shuffler.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        while todo:
            stub.Submit(shuffler_pb2.SubmitRequest(reports=todo[0]), timeout=10)
            acked.append(todo.pop(0))
        want = {tag_of(r.payload) for chunk in acked for r in chunk}
        # Reports buffered below min_batch are released at the next interval's end.
        wait_for(lambda: want <= set(sink.tags()), timeout=60)
        status = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)
    shuffler.stop()
    got = sink.tags()
    assert len(got) == len(set(got)), "a report reached the curator twice under different batch ids"
    assert set(got) == want, "the curator received a report never acknowledged"
    assert len(want) >= 200 and status.buffered_reports == 0


def _plain(tag: bytes) -> bytes:
    from shuffler_testkit import payload

    return payload(tag).SerializeToString()


def test_a_release_acknowledged_in_part_survives_a_crash(tmp_path):
    """A release cut into several batches keeps its reports' rows until the curator has taken every batch.
    Killed after some of its batches were acknowledged (the log is reopened with no shutdown code run), the
    shuffler neither buffers nor releases those reports again, sends the others' batches with the same ids
    and bytes, and frees the rows with the last acknowledgement."""
    from lac.common.v1 import curator_pb2
    from lac.shuffler.reportlog import ReportLog

    log = ReportLog(tmp_path)
    tags = [os.urandom(16) for _ in range(60)]
    log.append_groups([([(os.urandom(16), None, _plain(t)) for t in tags], None)], 0, 0, 1 << 30)
    released = log.release(1, max_batch_bytes=1024)
    assert released is not None and released.parts >= 3 and log.buffered() == log.takeable() == 0
    pending = log.pending_batches()
    bodies = {b: log.batch(b).body for b in pending}
    log.delivered(pending[0])
    log.delivered(pending[1])
    log._db.close()  # SIGKILL: nothing else runs; what was committed is what the next start sees

    log = ReportLog(tmp_path)
    assert log.buffered() == log.takeable() == 0 and log.release(1) is None  # held, not taken again
    assert log.pending_batches() == pending[2:]
    assert {b: log.batch(b).body for b in pending[2:]} == {b: bodies[b] for b in pending[2:]}
    (rows,) = log._db.execute("SELECT COUNT(*) FROM buffer").fetchone()
    assert rows == len(tags)  # nothing freed before the release is wholly acknowledged
    for b in pending[2:]:
        log.delivered(b)
        log.delivered(b)  # acknowledged twice (a redelivery): counted once
    assert log._db.execute("SELECT COUNT(*) FROM buffer").fetchone() == (0,)
    assert log._db.execute("SELECT COUNT(*) FROM batches WHERE seqs IS NOT NULL").fetchone() == (0,)
    assert log.counters()["reports_forwarded"] == len(tags) and log.pending_batches() == []
    log.close()
    log = ReportLog(tmp_path)
    assert log.buffered() == 0 and log.release(1) is None
    log.close()

    # What the curator got: every report once, and nothing but the batch id and the sealed payloads (no row
    # id, sequence number, client or window of the log).
    got = []
    for batch_id, body in bodies.items():
        request = curator_pb2.IngestBatchRequest.FromString(body)
        assert request.batch_id == batch_id and [f.name for f, _ in request.ListFields()] == ["batch_id", "reports"]
        assert request.SerializeToString() == body  # no field the message does not know
        got += [tag_of(p) for p in request.reports]
    assert sorted(got) == sorted(tags)


def test_a_crash_between_release_and_delivery_sends_the_same_batches(tmp_path):
    """Released, then killed before anything was sent: the next start finds the same pending batches, whose
    requests are byte for byte what the first would have sent, and no report buffered again."""
    from lac.shuffler.reportlog import ReportLog

    log = ReportLog(tmp_path)
    log.append_groups([([(os.urandom(16), None, _plain(os.urandom(16))) for _ in range(40)], None)], 0, 0, 1 << 30)
    log.release(1, max_batch_bytes=1024)
    pending = log.pending_batches()
    bodies = [log.batch(b).body for b in pending]
    log._db.close()
    log = ReportLog(tmp_path)
    assert log.pending_batches() == pending and [log.batch(b).body for b in pending] == bodies
    assert log.buffered() == 0
    log.close()
