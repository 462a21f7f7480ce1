"""Curator replicas over one PostgreSQL database and one shared directory (issue 35 item 3): each replica is a
``CuratorStore`` (or a real ``lac curator serve``) with its own state directory and the same ``shared_dir``. A release
made on one is read on another; a replica on another directory is refused; a replica's start leaves another's
uncommitted files alone (the grace); each replica's ledger journal puts back its own charges once; the local
channel's cache is built by one replica at a time. The process tests (slow) run two real servers."""

from __future__ import annotations

import os
import random
import threading
import time

import grpc
import numpy as np
import pytest
from curator_testkit import DAY, Stubs, Traffic, batch, opened_stores, serve_curator
from curator_testkit import stored_items as _items
from curator_testkit import stored_release as _release
from lac_testkit import DEADLINE, PROMPT, ledger_of

from lac.common.errors import DataLoss
from lac.common.privacy import Budget
from lac.common.statelock import waiting_lock
from lac.common.v1 import curator_pb2
from lac.curator.store import journal
from lac.curator.store import store as store_module
from lac.curator.store.store import FILES_MARKER, CuratorStore, FilesElsewhere


@pytest.fixture
def replica(tmp_path, postgres_url):
    """Factory: a ``CuratorStore`` on the test's PostgreSQL database with the state directory ``tmp_path/name`` and
    the shared directory ``tmp_path/shared`` (unless ``shared_dir`` says otherwise); closed after."""
    with opened_stores(tmp_path, postgres_url, shared_dir=tmp_path / "shared") as make:
        yield make


def test_a_release_made_on_one_replica_is_read_and_retried_on_another(replica, tmp_path):
    a, b = replica("a"), replica("b")
    a.add_batch("b1", [os.urandom(16)], _items, [], DAY, windows=(3, 3))
    assert _release(a, "r1", "q1") == "r1"
    assert [p.parent.parent.parent for p in b.segment_paths()] == [tmp_path / "shared"]
    record, items, log_probs, _, _ = b.release("r1")
    assert items == ("a", "b") and np.allclose(np.exp(log_probs), 0.5, rtol=1e-12)
    assert _release(b, "r2", "q1") == "r1"  # the retry on b: a's release, nothing written or spent
    assert b.spent() == {3: Budget(1.0, 0.0), 4: Budget(1.0, 0.0)}
    assert sorted(p.name for p in (tmp_path / "shared" / "releases").iterdir()) == ["r1.npz"]
    # Each replica keeps its own journal; none of the shared files is in a state directory.
    assert [c.release_id for c in journal.read(tmp_path / "a" / journal.JOURNAL_NAME)] == ["r1"]
    assert not (tmp_path / "a" / "segments").exists() and not (tmp_path / "b" / "releases").exists()


def test_a_replica_on_another_directory_is_refused(replica, tmp_path):
    a = replica("a")
    a.add_batch("b1", [os.urandom(16)], _items, [], DAY)
    marker = (tmp_path / "shared" / FILES_MARKER).read_text()
    with pytest.raises(FilesElsewhere, match="--shared-dir") as refused:
        replica("b", shared_dir=None)  # its own state directory: it would not see a's files
    assert str(tmp_path / "shared") in str(refused.value) and f"has no {FILES_MARKER}" in str(refused.value)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / FILES_MARKER).write_text("another id\n")
    with pytest.raises(FilesElsewhere, match="holds another id"):
        replica("c", shared_dir=tmp_path / "other")
    assert replica("d").counts()["batches"] == 1  # the same directory: served
    assert (tmp_path / "shared" / FILES_MARKER).read_text() == marker


def test_the_first_start_refuses_a_directory_without_the_files_the_database_names(tmp_path, postgres_url):
    """As after ``lac curator migrate`` with the segments left in the old state directory."""
    s = CuratorStore(tmp_path / "old", store=postgres_url)
    s.add_batch("b1", [os.urandom(16)], _items, [], DAY)
    s.database.execute("DELETE FROM meta WHERE key = 'files_dir'")  # as a database copied from SQLite: none
    s.close()
    with pytest.raises(FilesElsewhere, match="move the old state directory's segments/"):
        CuratorStore(tmp_path / "new", store=postgres_url, shared_dir=tmp_path / "shared")
    CuratorStore(tmp_path / "new", store=postgres_url, shared_dir=tmp_path / "old").close()


def _pause_before_commit(monkeypatch, written: threading.Event, go: threading.Event) -> None:
    """Make the next batch stored stop after its segment is written and fsync'd, before its commit."""
    fsync_dir = store_module.fsync_dir

    def paused(path):
        fsync_dir(path)
        if path.name == "segments" and not written.is_set():
            written.set()
            assert go.wait(DEADLINE)

    monkeypatch.setattr(store_module, "fsync_dir", paused)


@pytest.mark.parametrize("grace", [store_module.ORPHAN_GRACE_SECONDS, 0.0], ids=["grace", "broken-no-grace"])
def test_a_replica_starting_leaves_another_replicas_uncommitted_files(replica, monkeypatch, grace):
    """Replica a writes a batch's segment and stops before its commit; replica b starts meanwhile (removing
    orphans). With the grace a's segment stays and its batch is readable after the commit; the broken variant
    (no grace) deletes it and the acknowledged batch's segment is lost, so this test can fail."""
    monkeypatch.setattr(store_module, "ORPHAN_GRACE_SECONDS", grace)
    a = replica("a")
    written, go = threading.Event(), threading.Event()
    _pause_before_commit(monkeypatch, written, go)
    stored = threading.Thread(target=a.add_batch, args=("b1", [os.urandom(16)], _items, [], DAY))
    stored.start()
    assert written.wait(PROMPT)
    replica("b")  # its start removes the files no batch names, as old as the grace
    go.set()
    stored.join(DEADLINE)
    assert a.has_batch("b1")
    if grace:
        assert len(a.segment_paths()) == 1
    else:
        with pytest.raises(DataLoss, match="missing"):
            a.segment_paths()


def test_orphans_older_than_the_grace_are_removed(replica, tmp_path):
    a = replica("a")
    a.add_batch("b1", [os.urandom(16)], _items, [], DAY)
    _release(a, "r1")
    shared = tmp_path / "shared"
    fresh = [shared / "releases" / "r9.npz", shared / "segments" / "window=0" / ".x.parquet.tmp"]
    old = [shared / "releases" / "r8.npz", shared / "segments" / "window=0" / "gone-1234.parquet"]
    hour_ago = time.time() - store_module.ORPHAN_GRACE_SECONDS - 60
    for p in fresh + old:
        p.write_bytes(b"never committed")
    for p in old:
        os.utime(p, (hour_ago, hour_ago))
    b = replica("b")
    assert [p.exists() for p in fresh + old] == [True, True, False, False]
    assert len(b.segment_paths()) == 1 and b.release("r1") is not None


def test_each_replicas_journal_puts_its_charges_back_once(replica, tmp_path):
    """Each replica journals the charges it made (and, at its start, those the database had); after the database
    lost them (an older backup restored), each replica's start puts back what its journal holds, and no charge
    comes back twice however many journals hold it."""
    a, b = replica("a"), replica("b")
    _release(a, "r1", "q1", windows=[3])
    _release(b, "r2", "q2", windows=[4])
    a.database.script("DELETE FROM window_ledger; DELETE FROM release_requests")
    a.close(), b.close()
    assert replica("a2", shared_dir=tmp_path / "shared").spent() == {}  # a fresh replica has no journal
    assert replica("a").spent() == {3: Budget(1.0, 0.0)}
    b = replica("b")
    assert b.spent() == {3: Budget(1.0, 0.0), 4: Budget(1.0, 0.0)}
    assert replica("a").spent() == b.spent()  # a's journal now holds r2 as well: not put back again
    assert b.release_for_request("q1", "{}") == "r1" and b.release_for_request("q2", "{}") == "r2"


def test_the_channel_cache_lock_makes_a_second_builder_wait(tmp_path):
    lock = tmp_path / ".lock"
    held, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with waiting_lock(lock) as waited:
            assert not waited
            held.set()
            release.wait(DEADLINE)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    assert held.wait(PROMPT)
    with pytest.raises(InterruptedError):
        with waiting_lock(lock, stop=lambda: True, poll=0.01):
            pass
    threading.Timer(0.2, release.set).start()
    with waiting_lock(lock, poll=0.01) as waited:
        order.append("second")
    t.join(DEADLINE)
    assert waited and order == ["first done", "second"]


# -- two real servers ------------------------------------------------------------------------------------------------


def _serve(tmp_path, name: str, public_corpus, postgres_url, *extra: str):
    return serve_curator(
        tmp_path / name,
        tmp_path / name / "state",
        public_corpus,
        "--store",
        postgres_url,
        "--shared-dir",
        str(tmp_path / "shared"),
        "--min-free-disk-bytes",
        "0",
        "--no-clean-estimate",  # not about the local channel: a release never waits for it to be sampled
        *extra,
    )


def _release_request(rid: str, epsilon: float = 0.01) -> curator_pb2.ReleaseRequest:
    return curator_pb2.ReleaseRequest(epsilon=epsilon, delta=1e-8, force=True, request_id=rid)


def _top(stubs: Stubs, release_id: str) -> list[tuple[str, float]]:
    reply = stubs.query.TopNgrams(curator_pb2.TopNgramsRequest(release_id=release_id, k=20), timeout=DEADLINE)
    return [(n.ngram, n.probability) for n in reply.ngrams]


@pytest.mark.slow
def test_two_servers_share_batches_releases_and_the_last_epsilon(tmp_path, public_corpus, postgres_url):
    a = _serve(tmp_path, "a", public_corpus, postgres_url, "--budget-epsilon", "1.0")
    b = _serve(tmp_path, "b", public_corpus, postgres_url, "--budget-epsilon", "1.0")
    try:
        with Stubs(a.address) as sa, Stubs(b.address) as sb:
            same = batch(40, random.Random(1))
            threads = [threading.Thread(target=s.ingest.IngestBatch, args=(same,), kwargs={"timeout": DEADLINE})
                       for s in (sa, sb)]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join(DEADLINE)
            sa.ingest.IngestBatch(batch(40, random.Random(2)), timeout=DEADLINE)
            assert sb.status().batches == 2 and sb.status().reports == 80  # the same batch stored once

            made = sa.query.Release(_release_request("q1", 0.1), timeout=DEADLINE)
            again = sb.query.Release(_release_request("q1", 0.1), timeout=DEADLINE)  # retried on b: a's release
            assert again.release_id == made.release_id
            assert _top(sb, made.release_id) == _top(sa, made.release_id) and _top(sb, made.release_id)
            got = sb.query.GetRelease(curator_pb2.GetReleaseRequest(release_id=made.release_id), timeout=DEADLINE)
            assert got.record.release_id == made.release_id and len(got.items) > 0

            outcomes: list[str] = []  # 0.9 left: one release of 0.6 fits, two do not

            def race(s: Stubs, rid: str) -> None:
                try:
                    outcomes.append(s.query.Release(_release_request(rid, 0.6), timeout=DEADLINE).release_id)
                except grpc.RpcError as exc:
                    outcomes.append(exc.code().name)

            threads = [threading.Thread(target=race, args=(s, f"race-{i}")) for i, s in enumerate((sa, sb))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(DEADLINE)
            assert sorted(o == "FAILED_PRECONDITION" for o in outcomes) == [False, True], outcomes
            records = sb.query.ListReleases(curator_pb2.ListReleasesRequest(), timeout=DEADLINE).releases
            assert len(records) == 2
            spent = {w: e for w, (e, _) in sa.spent().items() if e}
            assert spent == pytest.approx(ledger_of(records), rel=1e-9)
            assert spent and spent == pytest.approx(dict.fromkeys(spent, 0.7), rel=1e-9)
    finally:
        a.stop(), b.stop()


def _check(stubs: Stubs, traffic: Traffic, shared) -> tuple[int, int]:
    """Every batch sent is stored once with its reports, every request id made one release, every window's ledger
    is the sum of its releases' charges, and every file the releases and batches need is in the shared directory
    (one that a killed replica wrote before its commit may stay there for the grace)."""
    status = stubs.status()
    records = list(stubs.query.ListReleases(curator_pb2.ListReleasesRequest(), timeout=DEADLINE).releases)
    assert status.batches == len(traffic.sent) and status.reports == sum(traffic.sent.values())
    assert sorted(r.request_id for r in records) == sorted(traffic.requests), "a request made 0 or 2 releases"
    releases = {p.name for p in (shared / "releases").iterdir()}
    assert {f"{r.release_id}.npz" for r in records} <= releases
    for r in records[-3:]:  # read from the shared directory
        stubs.query.GetRelease(curator_pb2.GetReleaseRequest(release_id=r.release_id), timeout=DEADLINE)
    assert {w: e for w, (e, _) in stubs.spent().items() if e} == pytest.approx(ledger_of(records), rel=1e-9, abs=1e-12)
    return status.batches, len(records)


@pytest.mark.slow
def test_sigkill_one_server_mid_ingest_and_mid_release_the_other_serves_on(tmp_path, public_corpus, postgres_url):
    """SIGKILL replica a while batches and releases arrive (twice mid-ingest, twice mid-release): b keeps serving
    and takes what a's kill cut off (same batch ids, same request ids, as the shuffler and CuratorClient send them
    again); a restarted serves again; after each kill the ledger is exact and every batch stored once."""
    seed = int.from_bytes(os.urandom(8), "big")
    rng = random.Random(seed)
    traffic = Traffic(random.Random(rng.random()))
    args = ("--budget-epsilon", "1000000")
    cut = {"batches": 0, "releases": 0}  # calls a's kills cut off, sent again to b
    b = _serve(tmp_path, "b", public_corpus, postgres_url, *args)
    try:
        for k in range(4):
            a = _serve(tmp_path, "a", public_corpus, postgres_url, *args)
            try:
                stop = threading.Event()
                threads = [threading.Thread(target=traffic.ingest, args=(a.address, stop))]
                if k % 2:
                    threads.append(threading.Thread(target=traffic.release, args=(a.address, stop)))
                for t in threads:
                    t.start()
                time.sleep(rng.uniform(0.3, 1.5))
                a.kill()
                stop.set()
                for t in threads:
                    t.join(DEADLINE)
                cut["batches"] += len(traffic.pending_batches)
                cut["releases"] += len(traffic.pending_releases)
                traffic.settle(b.address)  # b serves on, and takes over what a's kill cut off
                with Stubs(b.address) as sb:
                    batches, releases = _check(sb, traffic, tmp_path / "shared")
            finally:
                a.stop()
        a = _serve(tmp_path, "a", public_corpus, postgres_url, *args)  # a restarted serves again
        try:
            with Stubs(a.address) as sa:
                assert _check(sa, traffic, tmp_path / "shared") == (batches, releases)
            assert "Traceback" not in a.log_text() + b.log_text()
        finally:
            a.stop()
    finally:
        b.stop()
    assert batches >= 4 and releases >= 1 and cut["batches"] >= 2 and cut["releases"] >= 1, (cut, seed)
    print(
        f"replicas: 4 kills of a, {batches} batches ({sum(traffic.sent.values())} reports), {releases} releases; "
        f"cut off and sent to b: {cut}; seed {seed}"
    )


def test_a_shared_directory_needs_a_postgresql_store(tmp_path):
    """One curator on SQLite keeps its files in state_dir, where `lac curator backup` copies them from: a
    shared_dir elsewhere is refused (backups would miss the segments and releases); state_dir itself is allowed."""
    from lac.curator.service.config import CuratorConfig

    with pytest.raises(ValueError, match="shared_dir is for replicas over a PostgreSQL store"):
        CuratorConfig(state_dir=tmp_path / "state", shared_dir=tmp_path / "shared")
    CuratorConfig(state_dir=tmp_path / "state", shared_dir=tmp_path / "state")
    CuratorConfig(state_dir=tmp_path / "state", shared_dir=tmp_path / "shared", store="postgresql://lac@h/db")
