"""Disk full and I/O errors on a real ``lac shuffler serve`` process.

Three ways the storage fails under a running server: a real full filesystem (a small tmpfs,
filled by another file) with the free-space floor off, so SQLite's own writes fail (SQLITE_FULL);
the same with the floor on (``min_free_disk_bytes``: refused before a write fails); and a file-size
limit set on the running process (RLIMIT_FSIZE: every write past it fails with EFBIG, an I/O
error; CPython ignores SIGXFSZ). In each: Submit answers UNAVAILABLE with retry-after promptly
(never DEADLINE_EXCEEDED), health is NOT_SERVING, one log line and a metric say why, and once
space returns the server serves again by itself and every acknowledged report reaches the
curator exactly once. The same holds for the report log's PostgreSQL restarted or stopped under it."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time

import grpc
import pytest
from lac_testkit import DEADLINE, PROMPT, fill, mount_tmpfs
from shuffler_testkit import ServeProc, report, tag_of, wait_for

from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc


def _chunk(n: int = 5):
    return [
        shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=report(os.urandom(16)).payload, crowd_id="")
        for _ in range(n)
    ]


class Client:
    """Submits chunks of reports, timing each answer; keeps acknowledged and refused chunks."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = shuffler_pb2_grpc.ShufflerStub(self.channel)
        self.acked: list = []
        self.refused: list = []  # UNAVAILABLE: resent later with the same idempotency ids
        self.slowest = 0.0

    def submit(self, chunk) -> grpc.StatusCode:
        t0 = time.monotonic()
        try:
            self.stub.Submit(shuffler_pb2.SubmitRequest(reports=chunk), timeout=DEADLINE)  # answered well before
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            assert code == grpc.StatusCode.UNAVAILABLE, (code, exc.details())
            retry = dict(exc.trailing_metadata() or ())
            assert int(retry["retry-after-seconds"]) >= 1, retry
            self.last_error = exc.details()
        self.slowest = max(self.slowest, time.monotonic() - t0)
        (self.acked if code == grpc.StatusCode.OK else self.refused).append(chunk)
        return code


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["tmpfs-full", "tmpfs-low-space", "rlimit-fsize"])
def test_storage_failure_is_reported_and_recovers(tmp_path, sink, failure):
    if failure.startswith("tmpfs"):
        disk = tmp_path / "disk"
        if not mount_tmpfs(disk, "24m"):
            pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
        state = disk / "state"
    else:
        disk, state = None, tmp_path / "state"
    floor = 2 * 1024**2 if failure == "tmpfs-low-space" else 0
    proc = None
    try:
        proc = ServeProc(
            [
                "--state-dir",
                str(state),
                "--curator",
                sink.address,
                "--auth",
                "none",
                "--insecure",
                "--allow-plaintext-payloads",
                "--min-batch",
                "5",
                "--forward-retry-max-seconds",
                "0.2",
                "--min-free-disk-bytes",
                str(floor),
                "--metrics-port",
                "0",
            ],
            tmp_path / "proc",
        )
        client = Client(proc.address)
        for _ in range(10):  # healthy: stored, released, delivered
            assert client.submit(_chunk()) == grpc.StatusCode.OK
        wait_for(lambda: len(sink.tags()) == 50)

        if disk is not None:
            fill(disk)
        else:
            wal = state / "shuffler.sqlite-wal"
            limit = wal.stat().st_size  # no file may grow any more
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        codes = [client.submit(_chunk()) for _ in range(3)]
        for _ in range(200):  # a few commits may still fit in space SQLite already holds
            if codes[-1] == grpc.StatusCode.UNAVAILABLE:
                break
            codes.append(client.submit(_chunk()))
        assert codes[-1] == grpc.StatusCode.UNAVAILABLE, "the full disk was never noticed"
        assert "report log cannot be written" in client.last_error
        assert proc.health("") == "NOT_SERVING" and proc.health("lac.v1.Shuffler") == "NOT_SERVING"
        for _ in range(20):  # while full: every call is refused at once
            assert client.submit(_chunk()) == grpc.StatusCode.UNAVAILABLE
        assert client.slowest < PROMPT, f"an answer took {client.slowest:.1f}s"
        metrics = proc.metrics()
        assert "lac_shuffler_storage_ok 0" in metrics
        reasons = re.findall(r'lac_shuffler_storage_failures_total\{reason="([A-Z_]+)"\} [1-9]', metrics)
        want = {"tmpfs-full": "SQLITE_FULL", "tmpfs-low-space": "LOW_DISK_SPACE", "rlimit-fsize": "SQLITE_IOERR"}
        assert any(r.startswith(want[failure]) for r in reasons), reasons
        time.sleep(2)  # test writes keep failing meanwhile: still one log line
        assert proc.health("") == "NOT_SERVING"

        if disk is not None:
            (disk / "filler").unlink()
        else:
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        wait_for(lambda: proc.health("") == "SERVING" and proc.health("lac.v1.Shuffler") == "SERVING", timeout=30)
        assert client.submit(_chunk()) == grpc.StatusCode.OK
        refused, client.refused = client.refused, []
        for chunk in refused:  # what a client does with UNAVAILABLE: resend, same idempotency ids
            assert client.submit(chunk) == grpc.StatusCode.OK
        want_tags = {tag_of(r.payload) for chunk in client.acked for r in chunk}
        wait_for(lambda: want_tags <= set(sink.tags()), timeout=60)
        assert "lac_shuffler_storage_ok 1" in proc.metrics()
        client.channel.close()
    finally:
        if proc is not None:
            proc.stop()
        if disk is not None:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    got = sink.tags()
    assert len(got) == len(set(got)), "a report reached the curator twice under different batch ids"
    assert set(got) == want_tags, "a report reached the curator that was never acknowledged, or one is missing"
    text = proc.log_text()
    assert text.count("report log unusable") == 1 and text.count("report log writable again") == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.slow
def test_a_postgresql_restarted_or_down_is_unavailable_then_serving_again(tmp_path, sink, own_postgres_cluster):
    """``lac shuffler serve --store postgresql://…`` while its PostgreSQL restarts after a crash (``pg_ctl restart
    -m immediate``) and then stops for a while: Submit answers UNAVAILABLE with retry-after (never UNKNOWN or
    INTERNAL) within PROMPT, health is NOT_SERVING while the server is down, a metric names the reason; once it
    is back the shuffler serves again by itself and every acknowledged report reaches the curator exactly once."""
    cluster = own_postgres_cluster
    args = ["--state-dir", str(tmp_path / "state"), "--store", cluster.create_database("s"), "--curator", sink.address]
    args += ["--auth", "none", "--insecure", "--allow-plaintext-payloads", "--min-batch", "5"]
    proc = ServeProc([*args, "--forward-retry-max-seconds", "0.2", "--metrics-port", "0"], tmp_path / "proc")
    try:
        client = Client(proc.address)
        for _ in range(4):
            assert client.submit(_chunk()) == grpc.StatusCode.OK
        cluster.restart("immediate")  # every pooled connection is broken
        for _ in range(3):
            client.submit(_chunk())  # OK, or UNAVAILABLE while the server recovers
        wait_for(lambda: proc.health("") == "SERVING", timeout=60)
        assert client.submit(_chunk()) == grpc.StatusCode.OK

        cluster.stop_server("immediate")
        assert [client.submit(_chunk()) for _ in range(3)] == [grpc.StatusCode.UNAVAILABLE] * 3
        assert "report log cannot be written (POSTGRESQL_" in client.last_error, client.last_error
        assert proc.health("") == "NOT_SERVING" and proc.health("lac.v1.Shuffler") == "NOT_SERVING"
        assert client.slowest < PROMPT, f"an answer took {client.slowest:.1f}s"
        reasons = re.findall(r'lac_shuffler_storage_failures_total\{reason="([A-Z0-9_]+)"\} [1-9]', proc.metrics())
        assert any(r.startswith("POSTGRESQL_") for r in reasons), reasons

        cluster.start()
        wait_for(lambda: proc.health("") == "SERVING" and proc.health("lac.v1.Shuffler") == "SERVING", timeout=60)
        refused, client.refused = client.refused, []
        for chunk in refused:  # what a client does with UNAVAILABLE: resend, same idempotency ids
            assert client.submit(chunk) == grpc.StatusCode.OK
        want_tags = {tag_of(r.payload) for chunk in client.acked for r in chunk}
        wait_for(lambda: want_tags <= set(sink.tags()), timeout=60)
        client.channel.close()
    finally:
        proc.stop()
    got = sink.tags()
    assert len(got) == len(set(got)), "a report reached the curator twice under different batch ids"
    assert set(got) == want_tags, "a report reached the curator that was never acknowledged, or one is missing"
    text = proc.log_text()
    down = text.count("report log unusable")
    assert down >= 1 and down == text.count("report log writable again"), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
