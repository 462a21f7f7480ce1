"""A shuffler and a curator that disagree never jam delivery (issue 34 item 11): a shuffler whose privacy unit
is not the one the curator publishes acknowledges no report, and batches the curator refuses for good are set
aside as dead letters (listed, retried or dropped by the operator) so that newer batches are delivered."""

from __future__ import annotations

import os

import grpc
import pytest
from lac_testkit import DEADLINE, content, free_port, health, run_lac, wait_until

from lac.common import envelope
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc


def _reports(n: int) -> list[shuffler_pb2.ClientReport]:
    return [
        shuffler_pb2.ClientReport(
            idempotency_id=os.urandom(16), payload=envelope.seal_insecure(content(["the", "dog"]))
        )
        for _ in range(n)
    ]


def _submit(address: str, reports) -> None:
    with grpc.insecure_channel(address) as ch:
        shuffler_pb2_grpc.ShufflerStub(ch).Submit(shuffler_pb2.SubmitRequest(reports=reports), timeout=DEADLINE)


def _status(address: str) -> shuffler_pb2.ShufflerStatus:
    with grpc.insecure_channel(address) as ch:
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=DEADLINE)


def _stored_batches(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        return stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=DEADLINE).batches


def test_a_shuffler_whose_unit_is_not_the_curators_acknowledges_no_report(start_curator, start_shuffler, monkeypatch):
    """Refused at once, with both units named, health NOT_SERVING; served again once the curator's deployment agrees
    (fetched again every MISMATCH_RECHECK_SECONDS while they differ, here 0.2 s)."""
    monkeypatch.setattr("lac.shuffler.forward.MISMATCH_RECHECK_SECONDS", 0.2)
    port = free_port()
    cur = start_curator(port=port)  # a day per window
    shf = start_shuffler(cur.address, window_seconds=3600.0, min_batch=1)
    wait_until(lambda: shf.shuffler.deployment is not None, DEADLINE)
    with pytest.raises(grpc.RpcError) as refused:
        _submit(shf.address, _reports(1))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    details = refused.value.details()
    assert "3600" in details and "86400" in details and "nothing was stored" in details, details
    status = _status(shf.address)
    assert status.buffered_reports == 0 and status.rejects["deployment_mismatch"] == 1
    assert "MISCONFIGURED" in status.note
    assert health(shf.address) == "NOT_SERVING"
    agreeing = start_shuffler(cur.address, min_batch=1)  # the same curator, the same unit: served
    wait_until(lambda: agreeing.shuffler.deployment is not None, DEADLINE)
    _submit(agreeing.address, _reports(1))
    wait_until(lambda: _stored_batches(cur.address) == 1, DEADLINE)
    assert health(agreeing.address) == "SERVING"

    cur.stop()  # the curator's operator moves it to an hour per window (a new state): the first shuffler agrees now
    cur = start_curator(port=port, window_seconds=3600.0, state_dir=cur.curator.config.state_dir.parent / "hourly")
    wait_until(lambda: health(shf.address) == "SERVING", DEADLINE)
    _submit(shf.address, _reports(1))
    wait_until(lambda: _stored_batches(cur.address) == 1, DEADLINE)
    assert _status(shf.address).deployment_mismatch == ""


@pytest.mark.slow  # two shufflers, a curator, 40 batches refused: 10-20 s
def test_batches_the_curator_refuses_are_dead_letters_that_never_block_newer_ones(
    start_curator, start_shuffler, tmp_path, capsys
):
    """The issue's reproduction: a shuffler with an hour per window took 40 reports while the curator (a day per
    window) was away, released them in 40 batches, and the curator refuses each (FAILED_PRECONDITION). Fixed and
    restarted, the shuffler delivered none of its new batches: the 40 were retried first, forever. Now each refused
    batch is a dead letter at once, new batches are delivered, and the operator lists, retries or drops them."""
    port = free_port()
    state = tmp_path / "shuffler"
    wrong = start_shuffler(
        f"127.0.0.1:{port}", state_dir=state, window_seconds=3600.0, min_batch=1, forward_retry_max_seconds=0.2
    )
    for _ in range(40):  # the curator is not there yet: the shuffler does not know its deployment
        _submit(wrong.address, _reports(1))
    wait_until(lambda: _status(wrong.address).batches_pending == 40, DEADLINE)
    cur = start_curator(port=port)
    wait_until(lambda: wrong.shuffler.forward_failures >= 40, DEADLINE)  # each refused once at least
    wrong.stop()

    fixed = start_shuffler(cur.address, state_dir=state, min_batch=1, forward_retry_max_seconds=0.2)
    _submit(fixed.address, _reports(3))
    wait_until(lambda: _status(fixed.address).batches_forwarded == 1, DEADLINE)  # before: 40 pending, 0 forwarded
    wait_until(lambda: _status(fixed.address).batches_dead_letter == 40, DEADLINE)
    assert _status(fixed.address).batches_pending == 0 and _stored_batches(cur.address) == 1

    server = ["--server", fixed.address, "--insecure"]
    code, out, err = run_lac(capsys, "shuffler", "dead-letter", "list", *server)
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("batch ")]
    assert len(lines) == 40 and all("FAILED_PRECONDITION" in line and "3600" in line for line in lines), lines[:2]
    first = lines[0].split()[1].rstrip(":")
    code, out, err = run_lac(capsys, "shuffler", "dead-letter", "retry", first, *server)
    assert code == 0 and first in out, err
    wait_until(lambda: _status(fixed.address).counters["batches_dead_lettered"] == 41, DEADLINE)  # refused again
    assert _status(fixed.address).batches_dead_letter == 40
    code, out, err = run_lac(capsys, "shuffler", "dead-letter", "drop", "--all", *server)
    assert code == 0 and "40 batch(es) of 40 report(s)" in out, (out, err)
    status = _status(fixed.address)
    assert status.batches_dead_letter == 0 and status.counters["reports_dropped_dead_letter"] == 40
    assert status.buffered_reports == 0
    code, _, err = run_lac(capsys, "shuffler", "dead-letter", "drop", *server)
    assert code == 2 and "--all" in err
