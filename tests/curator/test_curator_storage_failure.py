"""Disk full and I/O errors under a real ``lac curator serve`` process.

Four ways the storage fails under a running curator: the segments' filesystem full (a small tmpfs
mounted at ``segments/``, filled by another file: writing a segment fails with ENOSPC), SQLite's
filesystem full (the state directory on a small tmpfs, ``segments/`` elsewhere: SQLITE_FULL), free
space below ``min_free_disk_bytes`` (refused before a write fails), and a file-size limit set on
the running process (RLIMIT_FSIZE: every write past it fails with EFBIG, an I/O error; CPython
ignores SIGXFSZ). In each: IngestBatch and Release answer UNAVAILABLE with retry-after promptly,
health is NOT_SERVING, one log line says why, a refused release charges nothing; once space
returns the curator serves again by itself, the refused batches (sent again, as the shuffler does)
are stored, and every acknowledged batch is there exactly once. The same holds for the curator's PostgreSQL
restarted or stopped under it."""

from __future__ import annotations

import os
import random
import resource
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from curator_testkit import CURATOR_SERVICES, Stubs, batch, serve_curator
from lac_testkit import DEADLINE, PROMPT, fill, health, mount_tmpfs, wait_until

from lac.common.v1 import curator_pb2


class Shuffler:
    """Sends batches as a shuffler does: a batch refused with UNAVAILABLE is kept and sent again later
    under the same id; the time of every answer is measured."""

    def __init__(self, stubs: Stubs):
        self.stubs = stubs
        self.acked: dict[str, int] = {}  # batch id -> reports accepted
        self.refused: list[curator_pb2.IngestBatchRequest] = []
        self.slowest = 0.0
        self.last_error = ""

    def send(self, request: curator_pb2.IngestBatchRequest) -> grpc.StatusCode:
        t0 = time.monotonic()
        try:
            reply = self.stubs.ingest.IngestBatch(request, timeout=DEADLINE)  # answered well before: PROMPT
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            assert code == grpc.StatusCode.UNAVAILABLE, (code, exc.details())
            assert int(dict(exc.trailing_metadata() or ())["retry-after-seconds"]) >= 1
            self.last_error = exc.details()
        self.slowest = max(self.slowest, time.monotonic() - t0)
        if code == grpc.StatusCode.OK:
            assert not reply.duplicate
            self.acked[request.batch_id] = reply.accepted
        else:
            self.refused.append(request)
        return code

    def resend_refused(self) -> curator_pb2.CuratorStatus:
        """Send the refused batches again (what a shuffler does with UNAVAILABLE), check that every acknowledged
        batch is stored once (a resend is a duplicate), and return the curator's status."""
        refused, self.refused = self.refused, []
        for request in refused:
            assert self.send(request) == grpc.StatusCode.OK
        for batch_id in self.acked:
            reply = self.stubs.ingest.IngestBatch(curator_pb2.IngestBatchRequest(batch_id=batch_id), timeout=10)
            assert reply.duplicate, batch_id
        status = self.stubs.status()
        assert status.batches == len(self.acked) and status.reports == sum(self.acked.values())
        return status


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["segments-full", "sqlite-full", "low-space", "rlimit-fsize"])
def test_storage_failure_is_reported_and_recovers(tmp_path, public_corpus, failure):
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    state, disk, floor = tmp_path / "state", None, 0
    if failure != "rlimit-fsize":
        disk = state / "segments" if failure == "segments-full" else state
        if not mount_tmpfs(disk, "4m" if failure == "segments-full" else "16m"):
            pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
        if failure == "sqlite-full":
            (tmp_path / "segments").mkdir()
            (state / "segments").symlink_to(tmp_path / "segments")
        if failure == "low-space":
            floor = 4 * 1024**2
    proc = None
    try:
        proc = serve_curator(tmp_path / "proc", state, public_corpus, "--min-free-disk-bytes", str(floor))
        with Stubs(proc.address) as stubs:
            shuffler = Shuffler(stubs)
            for _ in range(5):  # healthy
                assert shuffler.send(batch(40, rng)) == grpc.StatusCode.OK
            spent = stubs.spent()

            release = curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True, request_id="r-1")
            if failure == "rlimit-fsize":
                # No file may grow: the release's file is written, its commit is not, so it fails as a whole.
                wal = state / "curator.sqlite-wal"
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (wal.stat().st_size, resource.RLIM_INFINITY))
                with pytest.raises(grpc.RpcError) as err:
                    stubs.query.Release(release, timeout=60)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
            elif failure == "low-space":
                filler = disk / "filler"  # leave half the floor free: below it, nothing fails yet
                with open(filler, "wb") as f:
                    f.truncate(0)
                    f.write(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - floor // 2))
                wait_until(lambda: proc.health("") == "NOT_SERVING", timeout=10)  # noticed without traffic
            else:
                fill(disk)
            codes = [shuffler.send(batch(40, rng))]
            for _ in range(100):  # a few commits may still fit in space SQLite already holds
                if codes[-1] == grpc.StatusCode.UNAVAILABLE:
                    break
                codes.append(shuffler.send(batch(40, rng)))
            assert codes[-1] == grpc.StatusCode.UNAVAILABLE, "the failing storage was never noticed"
            assert "cannot be written" in shuffler.last_error
            assert all(proc.health(s) == "NOT_SERVING" for s in CURATOR_SERVICES)
            for _ in range(10):  # while it fails: every batch is refused at once
                assert shuffler.send(batch(40, rng)) == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.RpcError) as err:
                stubs.query.Release(release, timeout=60)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert shuffler.slowest < PROMPT, f"an answer took {shuffler.slowest:.1f}s"
            assert stubs.status().releases == 0 and stubs.spent() == spent  # nothing charged
            time.sleep(2)  # test writes keep failing meanwhile: still one log line
            assert proc.health("") == "NOT_SERVING"

            if failure == "rlimit-fsize":
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            else:
                (disk / "filler").unlink()
            wait_until(lambda: all(proc.health(s) == "SERVING" for s in CURATOR_SERVICES), timeout=30)
            status = shuffler.resend_refused()
            record = stubs.query.Release(release, timeout=60)  # the refused release, same request id
            assert record.n_reports == status.reports and record.request_id == "r-1"
            assert stubs.status().releases == 1
            assert len(list((state / "releases").iterdir())) == 1
    finally:
        if proc is not None:
            proc.stop()
        if disk is not None:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    text = proc.log_text()
    assert text.count("curator storage (segments and SQLite) unusable") == 1, text[-3000:]
    assert text.count("curator storage (segments and SQLite) writable again") == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_a_hanging_disk_is_reported_as_stalled_and_recovers(start_curator):
    """A storage operation with no answer for stall_timeout_seconds (a hanging disk, simulated by holding
    the store's commit) turns health NOT_SERVING and refuses further writes at once; when the disk answers
    again the held batch is stored, a test write restores SERVING, and the refused batch is taken."""
    srv = start_curator(allow_plaintext_payloads=True, stall_timeout_seconds=0.5, ingest_workers=1)
    store = srv.curator.store
    original, disk_back = store.add_batch, threading.Event()

    def hanging(*args, **kwargs):
        disk_back.wait(60)
        return original(*args, **kwargs)

    store.add_batch = hanging
    with Stubs(srv.address) as stubs, ThreadPoolExecutor(1) as pool:
        held = pool.submit(stubs.ingest.IngestBatch, batch(20), timeout=60)
        wait_until(lambda: health(srv.address) == "NOT_SERVING", timeout=10)
        t0 = time.monotonic()
        refused = batch(20)
        with pytest.raises(grpc.RpcError) as err:
            stubs.ingest.IngestBatch(refused, timeout=DEADLINE)
        assert time.monotonic() - t0 < PROMPT
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "STALLED" in err.value.details() and "stall_timeout_seconds" in err.value.details()
        assert srv.curator.storage.failures == {"STALLED": 1}
        disk_back.set()
        assert held.result(60).accepted == 20
        wait_until(lambda: health(srv.address) == "SERVING", timeout=30)
        assert stubs.ingest.IngestBatch(refused, timeout=10).accepted == 20
        assert stubs.status().reports == 40


@pytest.mark.slow
def test_a_postgresql_restarted_or_down_is_unavailable_then_serving_again(
    tmp_path, public_corpus, own_postgres_cluster
):
    """``lac curator serve --store postgresql://…`` while its PostgreSQL restarts after a crash (``pg_ctl restart
    -m immediate``) and then stops for a while: calls answer UNAVAILABLE with retry-after (never UNKNOWN or
    INTERNAL) within PROMPT, health is NOT_SERVING while the server is down, one log line says why; once it is
    back the curator serves again by itself, the refused batches sent again are stored, every acknowledged batch
    is there exactly once, and the release refused meanwhile charged nothing and goes through."""
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    cluster = own_postgres_cluster
    store = cluster.create_database("c")  # the local channel is not what this is about: releases do not wait for it
    proc = serve_curator(tmp_path / "proc", tmp_path / "state", public_corpus, "--store", store, "--no-clean-estimate")
    try:
        with Stubs(proc.address) as stubs:
            shuffler = Shuffler(stubs)
            for _ in range(3):
                assert shuffler.send(batch(40, rng)) == grpc.StatusCode.OK
            cluster.restart("immediate")  # every pooled connection is broken
            for _ in range(3):
                shuffler.send(batch(40, rng))  # OK, or UNAVAILABLE while the server recovers
            wait_until(lambda: all(proc.health(s) == "SERVING" for s in CURATOR_SERVICES), timeout=60)
            assert shuffler.send(batch(40, rng)) == grpc.StatusCode.OK
            spent = stubs.spent()

            cluster.stop_server("immediate")
            codes = [shuffler.send(batch(40, rng)) for _ in range(3)]
            assert codes == [grpc.StatusCode.UNAVAILABLE] * 3
            assert "cannot be written (POSTGRESQL_" in shuffler.last_error, shuffler.last_error
            assert all(proc.health(s) == "NOT_SERVING" for s in CURATOR_SERVICES)
            release = curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True, request_id="r-1")
            with pytest.raises(grpc.RpcError) as err:
                stubs.query.Release(release, timeout=DEADLINE)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
            assert shuffler.slowest < PROMPT, f"an answer took {shuffler.slowest:.1f}s"

            cluster.start()
            wait_until(lambda: all(proc.health(s) == "SERVING" for s in CURATOR_SERVICES), timeout=60)
            assert stubs.spent() == spent  # nothing charged
            status = shuffler.resend_refused()
            assert stubs.query.Release(release, timeout=60).n_reports == status.reports
    finally:
        proc.stop()
    text = proc.log_text()
    down = text.count("curator storage (segments and PostgreSQL) unusable")
    assert down >= 1 and down == text.count("curator storage (segments and PostgreSQL) writable again"), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
