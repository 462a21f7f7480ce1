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
def test_sigkill_loses_no_acknowledged_report(tmp_path, sink):
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
