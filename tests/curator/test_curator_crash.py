"""Crash safety of the curator: SIGKILL a real ``lac curator serve`` at random moments while a
shuffler's batches arrive and releases run, including the instant a release's file appears (its
temporary file, then its final name, before the ledger commit).

After every restart, once the batches and releases whose answers the kill cut off have been sent
again (same batch ids, same request ids: what the shuffler and ``CuratorClient`` do): every batch
is stored exactly once and the stored report count is exactly what was sent; the segment files
are exactly the ones the database names; the release files are exactly the release rows; each
request id made one release; and every window's ledger is the sum of what its releases charged."""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time

import pytest
from curator_testkit import Stubs, Traffic, serve_curator

from lac.common.v1 import curator_pb2

KILLS = 22


def _files(directory) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}


def check(address: str, state, traffic: Traffic) -> tuple[int, int]:
    """The invariants after a restart (see the module docstring); returns (batches, releases)."""
    with Stubs(address) as s:
        status = s.status()
        records = list(s.query.ListReleases(curator_pb2.ListReleasesRequest(), timeout=30).releases)
        spent = {w: e for w, (e, _) in s.spent().items()}
    assert status.batches == len(traffic.sent), (status.batches, len(traffic.sent))
    assert status.reports == sum(traffic.sent.values()), (status.reports, sum(traffic.sent.values()))
    db = sqlite3.connect(f"file:{state / 'curator.sqlite'}?mode=ro", uri=True)
    try:
        batch_ids = {b for (b,) in db.execute("SELECT batch_id FROM batches")}
        segments = {name for (name,) in db.execute("SELECT segment FROM batches WHERE segment IS NOT NULL")}
        requests = dict(db.execute("SELECT request_id, release_id FROM release_requests"))
    finally:
        db.close()
    assert batch_ids == set(traffic.sent)
    assert _files(state / "segments") == segments, "a segment without its batch, or a batch without its segment"
    assert _files(state / "releases") == {f"{r.release_id}.npz" for r in records}, "release files != release rows"
    assert sorted(r.request_id for r in records) == sorted(traffic.requests), "a request made 0 or 2 releases"
    assert requests == {r.request_id: r.release_id for r in records}
    want: dict[int, float] = {}
    for r in records:
        for w in range(r.first_window, r.last_window + 1):
            want[w] = want.get(w, 0.0) + r.ledger_epsilon
    assert {w: e for w, e in spent.items() if e} == pytest.approx(want, rel=1e-9, abs=1e-12)
    return status.batches, len(records)


def _kill_when(proc, directory, appears, deadline: float) -> bool:
    """SIGKILL ``proc`` as soon as a file for which ``appears(name)`` holds shows up in ``directory``."""
    before = set(os.listdir(directory))
    while time.monotonic() < deadline:
        if any(appears(n) for n in set(os.listdir(directory)) - before):
            proc.kill()
            return True
    return False


@pytest.mark.slow
def test_sigkill_during_ingest_and_releases_keeps_ledger_releases_and_files_in_agreement(tmp_path, public_corpus):
    seed = int(os.environ.get("LAC_CRASH_SEED") or int.from_bytes(os.urandom(8), "big"))
    rng = random.Random(seed)
    state = tmp_path / "state"
    # Not about the local channel: without it a release never waits for the channel to be sampled.
    args = ("--budget-epsilon", "1000000", "--min-free-disk-bytes", "0", "--no-clean-estimate")
    traffic = Traffic(random.Random(rng.random()))
    kinds = {"ingest": 0, "release": 0, "release file": 0, "release temporary file": 0}
    at_file = 0  # kills at the instant a release's (temporary or final) file appeared
    for k in range(KILLS + 1):
        proc = serve_curator(tmp_path / "proc", state, public_corpus, *args)
        try:
            traffic.settle(proc.address)
            batches, releases = check(proc.address, state, traffic)
            if k == KILLS:
                break
            stop, started = threading.Event(), threading.Event()
            threads = [threading.Thread(target=traffic.ingest, args=(proc.address, stop))]
            kind = "ingest" if k % 2 == 0 else ("release", "release file", "release temporary file")[(k // 2) % 3]
            if kind != "ingest":
                threads.append(threading.Thread(target=traffic.release, args=(proc.address, stop, started)))
            for t in threads:
                t.start()
            if kind in ("ingest", "release"):
                time.sleep(rng.uniform(0.05, 0.8))
                proc.kill()
            else:
                started.wait(10)
                final = kind == "release file"
                killed = _kill_when(
                    proc,
                    state / "releases",
                    (lambda n: n.endswith(".npz") and not n.startswith("."))
                    if final
                    else (lambda n: n.startswith(".") and n.endswith(".tmp")),
                    time.monotonic() + 20,
                )
                at_file += killed
                if not killed:
                    proc.kill()
            kinds[kind] += 1
            stop.set()
            for t in threads:
                t.join(30)
        finally:
            proc.stop()
    assert sum(kinds.values()) == KILLS and min(kinds.values()) >= 3, kinds
    assert batches >= 50 and releases >= 10, (batches, releases, seed)
    removed = [
        int(m.group(1))
        for m in re.finditer(r"removed (\d+) release file\(s\) that were never committed", proc.log_path.read_text())
    ]
    assert at_file >= 4 and sum(removed) >= 1, (at_file, removed, seed)  # the orphans of those kills went
    assert "Traceback" not in proc.log_path.read_text()
    print(
        f"crash: {KILLS} kills {kinds}, {at_file} as a release file appeared; {sum(removed)} uncommitted release "
        f"files removed at restarts; {batches} batches ({sum(traffic.sent.values())} reports), {releases} "
        f"releases; seed {seed}"
    )
