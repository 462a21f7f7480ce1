"""The shuffler's durable state: buffered reports, released batches awaiting delivery.

SQLite in WAL mode with ``synchronous=FULL``: a commit returns only after fsync, so a
report acknowledged to a client survives a crash. Rows carry no identity and no time;
the arrival sequence number exists only while a report is buffered and never leaves
this file. Released batches are stored already shuffled, so redelivery after a crash
sends the same batch id with the same content.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

from lac.shuffler.shuffle import secure_shuffle

_SCHEMA = """
CREATE TABLE IF NOT EXISTS buffer (seq INTEGER PRIMARY KEY, encoding INTEGER NOT NULL,
                                   key_id TEXT NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS seen (idempotency_id BLOB PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (batch_id TEXT NOT NULL, pos INTEGER NOT NULL, encoding INTEGER NOT NULL,
                                   key_id TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (batch_id, pos));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class Payload:
    encoding: int
    key_id: str
    data: bytes


class ReportLog:
    """Durable buffer + outbox. Not thread-safe: use from one thread."""

    def __init__(self, state_dir: Path):
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "reports.sqlite"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._buffered = self._db.execute("SELECT COUNT(*) FROM buffer").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    def append(self, reports: list[tuple[bytes, Payload]]) -> list[bool]:
        """Store new reports durably (one fsync'd transaction); True = stored, False = duplicate."""
        stored = []
        with self._tx():
            for idem, p in reports:
                cur = self._db.execute("INSERT OR IGNORE INTO seen VALUES (?)", (idem,))
                if cur.rowcount:
                    self._db.execute("INSERT INTO buffer (encoding, key_id, data) VALUES (?, ?, ?)",
                                     (p.encoding, p.key_id, p.data))
                stored.append(bool(cur.rowcount))
        self._buffered += sum(stored)
        return stored

    def buffered(self) -> int:
        """Reports waiting for a batch (kept in memory; the table is only counted at open)."""
        return self._buffered

    def release(self, min_batch: int) -> tuple[str, int] | None:
        """Move every buffered report into one shuffled batch if there are at least ``min_batch``."""
        with self._tx():
            rows = self._db.execute("SELECT encoding, key_id, data FROM buffer").fetchall()
            if len(rows) < min_batch:
                return None
            secure_shuffle(rows)
            batch_id = uuid.UUID(bytes=os.urandom(16)).hex
            self._db.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?, ?)",
                                 ((batch_id, i, *row) for i, row in enumerate(rows)))
            self._db.execute("DELETE FROM buffer")
            self._bump("batches_released", 1)
        self._buffered = 0
        return batch_id, len(rows)

    def pending_batches(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT batch_id FROM outbox ORDER BY batch_id")]

    def batch(self, batch_id: str) -> list[Payload]:
        rows = self._db.execute("SELECT encoding, key_id, data FROM outbox WHERE batch_id = ? ORDER BY pos",
                                (batch_id,))
        return [Payload(*r) for r in rows]

    def delivered(self, batch_id: str) -> None:
        """Forget a batch the curator has acknowledged."""
        with self._tx():
            n = self._db.execute("DELETE FROM outbox WHERE batch_id = ?", (batch_id,)).rowcount
            if n:
                self._bump("batches_forwarded", 1)
                self._bump("reports_forwarded", n)

    def count_reject(self, reason: str, n: int = 1) -> None:
        with self._tx():
            self._bump("reject:" + reason, n)

    def counters(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, value FROM counters"))

    def _bump(self, name: str, n: int) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                         (name, n, n))

    def _tx(self):
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
