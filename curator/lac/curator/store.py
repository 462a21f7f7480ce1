"""The curator's durable state: ingested batches and reports, releases, reject counters.

SQLite (WAL, ``synchronous=FULL``): a batch is acknowledged only after its transaction
commits. Release arrays (released log-probabilities, operator-only pre-noise mean) live
beside it as ``releases/<id>.npz``, written before the release row commits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lac.common.files import atomic_file
from lac.common.v1 import curator_pb2, reports_pb2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, accepted INTEGER NOT NULL, rejected INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reports (id INTEGER PRIMARY KEY, report_id BLOB NOT NULL UNIQUE, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS releases (release_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class CuratorStore:
    def __init__(self, state_dir: Path):
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "releases").mkdir(exist_ok=True)
        self.state_dir = state_dir
        self._db = sqlite3.connect(state_dir / "curator.sqlite", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def has_batch(self, batch_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone() is not None

    def add_batch(self, batch_id: str, contents: list[reports_pb2.ReportContent],
                  rejects: dict[str, int]) -> tuple[int, int]:
        """Store a batch's valid reports atomically; a replayed report id is rejected. Returns (accepted, rejected)."""
        rejects = dict(rejects)
        accepted = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for c in contents:
                cur = self._db.execute("INSERT OR IGNORE INTO reports (report_id, content) VALUES (?, ?)",
                                       (c.report_id, c.SerializeToString()))
                if cur.rowcount:
                    accepted += 1
                else:
                    rejects["replayed_report_id"] = rejects.get("replayed_report_id", 0) + 1
            rejected = sum(rejects.values())
            self._db.execute("INSERT INTO batches VALUES (?, ?, ?)", (batch_id, accepted, rejected))
            for reason, n in rejects.items():
                self._bump("reject:" + reason, n)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return accepted, rejected

    def reports(self) -> Iterator[list[list[str]]]:
        """Every stored report's perturbed sentences, in storage order."""
        for (blob,) in self._db.execute("SELECT content FROM reports ORDER BY id"):
            c = reports_pb2.ReportContent.FromString(blob)
            yield [list(s.tokens) for s in c.sentences]

    def counts(self) -> dict[str, int]:
        batches, = self._db.execute("SELECT COUNT(*) FROM batches").fetchone()
        reports, = self._db.execute("SELECT COUNT(*) FROM reports").fetchone()
        releases, = self._db.execute("SELECT COUNT(*) FROM releases").fetchone()
        return {"batches": batches, "reports": reports, "releases": releases}

    def rejects(self) -> dict[str, int]:
        return {k.split(":", 1)[1]: v for k, v in self._db.execute("SELECT name, value FROM counters")
                if k.startswith("reject:")}

    def add_release(self, record: curator_pb2.ReleaseRecord, log_probs: np.ndarray, mean: np.ndarray) -> None:
        with atomic_file(self.state_dir / "releases" / f"{record.release_id}.npz") as fh:
            np.savez(fh, log_probs=log_probs, mean=mean)
        self._db.execute("INSERT INTO releases VALUES (?, ?)", (record.release_id, record.SerializeToString()))

    def releases(self) -> list[curator_pb2.ReleaseRecord]:
        rows = self._db.execute("SELECT record FROM releases")
        return sorted((curator_pb2.ReleaseRecord.FromString(r[0]) for r in rows), key=lambda r: r.created_at)

    def release(self, release_id: str) -> tuple[curator_pb2.ReleaseRecord, np.ndarray, np.ndarray] | None:
        row = self._db.execute("SELECT record FROM releases WHERE release_id = ?", (release_id,)).fetchone()
        if row is None:
            return None
        with np.load(self.state_dir / "releases" / f"{release_id}.npz") as z:
            return curator_pb2.ReleaseRecord.FromString(row[0]), z["log_probs"], z["mean"]

    def _bump(self, name: str, n: int) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                         (name, n, n))
