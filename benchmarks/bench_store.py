#!/usr/bin/env python3
"""The services' databases on their hot paths: SQLite in a state directory against PostgreSQL on this machine (a
private cluster, ``lac.common.pgcluster``, fsync on like SQLite's ``synchronous=FULL``), in one run. Only the
database's part is timed: the segment a batch writes is the same file either way, so it holds one report.

    python benchmarks/bench_store.py [--batches 20] [--reports 1000] [--submits 200]

* curator ingest: ``CuratorStore.add_batch`` of a batch of ``--reports`` reports (its report ids checked against
  the replay window and stored, one transaction);
* curator release: what a release asks of the store over 1,000,000 stored reports in 10 batches (its segments'
  paths, the budget spent, ``add_release`` with its charge);
* shuffler Submit: ``ReportLog.append_groups`` of 32 Submit calls of 8 reports from distinct clients (one group
  commit, as under load), ``--submits`` such commits.

Prints seconds per operation on each database and the ratio PostgreSQL / SQLite, with the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import load

from lac.common.pgcluster import PostgresCluster
from lac.common.privacy import Budget
from lac.curator.base.ngrams import ReportItems
from lac.curator.store.store import CuratorStore
from lac.shuffler.reportlog import ReportLog


def _one_report(keep) -> ReportItems:
    return ReportItems(np.array([0, 1], np.int64), np.zeros(1, np.int32), np.ones(1, np.int32), ("a",))


def curator(root: Path, store: str, batches: int, reports: int) -> tuple[float, float]:
    s = CuratorStore(root, store=store)
    try:
        t0 = time.perf_counter()
        for b in range(batches):
            s.add_batch(f"b{b}", [os.urandom(16) for _ in range(reports)], _one_report, [], 30 * 86400.0)
        ingest = (time.perf_counter() - t0) / batches
        (segment,) = s.database.execute("SELECT segment FROM batches LIMIT 1").fetchone()
        for b in range(10):  # the metadata of a million stored reports: 10 batches of 100,000 (one file for all)
            s.database.execute(
                "INSERT INTO batches (batch_id, accepted, rejected, segment, received_at) VALUES (?, 100000, 0, ?, 0)",
                (f"big{b}", segment),
            )
        t0 = time.perf_counter()
        for r in range(20):
            s.segment_paths(0, 0)
            s.spent([0])
            s.add_release(f"r{r}", b"{}", ("a",), np.zeros(1), None, [0], Budget(0.01), Budget(1.0))
        release = (time.perf_counter() - t0) / 20
    finally:
        s.close()
    return ingest, release


def shuffler(root: Path, store: str, submits: int) -> float:
    log = ReportLog(root, store)
    try:
        t0 = time.perf_counter()
        for c in range(submits):
            groups = [
                ([(os.urandom(16), None, os.urandom(560)) for _ in range(8)], log.client_key(f"c{c}-{g}"))
                for g in range(32)
            ]
            log.append_groups(groups, window=1, quota=8, max_bytes=1 << 40)
        return (time.perf_counter() - t0) / submits
    finally:
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--submits", type=int, default=200)
    args = ap.parse_args()
    cluster = PostgresCluster(durable=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = {}
            for name, store in (("sqlite", ""), ("postgresql", None)):
                url = store if store is not None else cluster.create_database(f"bench_{int(time.time())}")
                root = Path(tmp) / name
                ingest, release = curator(root / "curator", url, args.batches, args.reports)
                url = store if store is not None else cluster.create_database(f"bench_s_{int(time.time())}")
                submit = shuffler(root / "shuffler", url, args.submits)
                rows[name] = (ingest, release, submit)
                print(
                    f"{load()}  {name}: curator ingest {ingest * 1e3:.1f} ms/batch of {args.reports}, release's "
                    f"store part {release * 1e3:.1f} ms, shuffler group commit {submit * 1e3:.1f} ms/256 reports"
                )
            sq, pg = rows["sqlite"], rows["postgresql"]
            print(
                f"{load()}  PostgreSQL / SQLite: ingest {pg[0] / sq[0]:.2f}x, release {pg[1] / sq[1]:.2f}x, "
                f"group commit {pg[2] / sq[2]:.2f}x"
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
