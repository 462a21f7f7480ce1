"""The shuffler's durable state: buffered reports, released batches awaiting delivery,
per-epoch quota counters.

SQLite in WAL mode with ``synchronous=FULL``: a commit returns only after fsync, so a
report acknowledged to a client survives a crash. ``append_groups`` commits many Submit
calls in one transaction (group commit: one fsync for all of them).

What is stored where:
* ``buffer``: the sealed payload (re-serialized from its known fields only, framed as an
  ``IngestBatchRequest.reports`` entry) and the optional crowd id. No identity, no time; ``seq`` (arrival order) exists only while a
  report is buffered and never leaves this file.
* ``batches``: a released batch as the exact bytes of the ``IngestBatchRequest`` that will
  be sent, already shuffled, so a redelivery after a crash sends the same batch id with the
  same content. The body is dropped once the curator acknowledges it.
* ``quota``: reports per (epoch, keyed hash of the client id); rows of past epochs are
  deleted at each epoch change. Nothing links a quota row to a report.
* ``seen`` / ``seen_prev``: idempotency ids in two generations. ``rotate_seen`` drops the older
  one and starts a new one once a window has passed, so an id is remembered for at least one
  window and at most two, and the tables stay bounded. Nothing links an id to a report.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import sqlite3
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lac.common.v1 import curator_pb2
from lac.shuffler.shuffle import bernoulli_mask, secure_permutation

log = logging.getLogger(__name__)

_SEEN_TABLE = "CREATE TABLE IF NOT EXISTS {} (idempotency_id BLOB PRIMARY KEY) WITHOUT ROWID"  # one generation

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS buffer (seq INTEGER PRIMARY KEY, crowd TEXT, payload BLOB NOT NULL);
{_SEEN_TABLE.format("seen")};
{_SEEN_TABLE.format("seen_prev")};
CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, n INTEGER NOT NULL, body BLOB,
                                    privacy BLOB, delivered INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS quota (epoch INTEGER NOT NULL, client BLOB NOT NULL, n INTEGER NOT NULL,
                                  PRIMARY KEY (epoch, client)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
"""

OVER_QUOTA = "over_quota"
LOG_FULL = "log_full"
KEEP_DELIVERED = 50  # metadata rows of delivered batches kept for `status`

_REPORTS_FIELD = curator_pb2.IngestBatchRequest.DESCRIPTOR.fields_by_name["reports"].number
_REPORTS_TAG = bytes([(_REPORTS_FIELD << 3) | 2])  # length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True)
class Released:
    batch_id: str | None  # None: every buffered report was dropped by sub-sampling/crowd threshold
    size: int
    considered: int
    dropped_subsampled: int
    dropped_crowd: int
    parts: int = 1  # batches the release was split into (each at most max_batch_bytes)


def _chunks(entries: list[bytes], max_bytes: int) -> list[tuple[int, int]]:
    """[lo, hi) slices of ``entries`` whose summed sizes stay within ``max_bytes`` (at least one entry each)."""
    out, lo, size = [], 0, 0
    for i, e in enumerate(entries):
        if size + len(e) > max_bytes and i > lo:
            out.append((lo, i))
            lo, size = i, 0
        size += len(e)
    if lo < len(entries):
        out.append((lo, len(entries)))
    return out


class ReportLog:
    """Durable buffer + released batches. Not thread-safe: use from one thread."""

    def __init__(self, state_dir: Path):
        state_dir.mkdir(parents=True, exist_ok=True)
        if (state_dir / "reports.sqlite").exists():
            log.warning("%s is the pre-0.2 report log format and is not read; deliver or migrate its "
                        "batches with the previous version first", state_dir / "reports.sqlite")
        self.path = state_dir / "shuffler.sqlite"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA cache_size=-65536")  # 64 MiB: the idempotency index is random-access
        # Checkpoint the WAL into the database every ~40 MiB instead of every 4 MiB: halves ingest cost.
        self._db.execute("PRAGMA wal_autocheckpoint=10000")
        self._db.executescript(_SCHEMA)
        self._buffered = self._db.execute("SELECT COUNT(*) FROM buffer").fetchone()[0]
        self._page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        with self._tx():
            row = self._db.execute("SELECT value FROM meta WHERE name = 'client_key'").fetchone()
            if row is None:
                row = (os.urandom(32),)
                self._db.execute("INSERT INTO meta VALUES ('client_key', ?)", row)
            if self._db.execute("SELECT 1 FROM meta WHERE name = 'seen_since'").fetchone() is None:
                self._db.execute("INSERT INTO meta VALUES ('seen_since', ?)", (repr(time.time()).encode(),))
        self._client_key = row[0]
        self.used_bytes = self._measure()
        self.commits = 0  # group commits since open (one fsync each)

    def close(self) -> None:
        self._db.close()

    def client_key(self, client_id: str) -> bytes:
        """Keyed hash of a client id: what the quota table stores instead of the id."""
        return hmac.new(self._client_key, client_id.encode(), hashlib.sha256).digest()[:16]

    def _measure(self) -> int:
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        return (pages - free) * self._page_size

    def append_groups(self, groups, epoch: int, quota: int, max_bytes: int) -> list:
        """Store the reports of many Submit calls in one fsync'd transaction.

        ``groups``: list of (items, client_key or None), items = [(idempotency_id, crowd, payload)].
        Returns per group a list of bools (True = stored, False = duplicate), or ``OVER_QUOTA``
        (nothing of that group stored) or ``LOG_FULL``.
        """
        if self.used_bytes >= max_bytes:
            self._count({"reject:" + LOG_FULL: sum(len(g[0]) for g in groups)})
            return [LOG_FULL] * len(groups)
        results, bumps = [], Counter()
        db = self._db
        with self._tx():
            known = self._known([it[0] for items, _ in groups for it in items])
            for items, client in groups:
                metered = client is not None and quota > 0
                if metered:
                    db.execute("SAVEPOINT g")
                stored, fresh = [], []
                for idem, crowd, payload in items:
                    new = idem not in known
                    if new:
                        known.add(idem)
                        fresh.append((idem, crowd, payload))
                    stored.append(new)
                db.executemany("INSERT INTO seen VALUES (?)", ((f[0],) for f in fresh))
                # Stored framed as a repeated `reports` field entry, ready to be concatenated at release.
                db.executemany("INSERT INTO buffer (crowd, payload) VALUES (?, ?)",
                               ((c, _REPORTS_TAG + _varint(len(p)) + p) for _, c, p in fresh))
                n_new = len(fresh)
                if metered:
                    row = db.execute("SELECT n FROM quota WHERE epoch = ? AND client = ?", (epoch, client)).fetchone()
                    if (row[0] if row else 0) + n_new > quota:
                        db.execute("ROLLBACK TO g")
                        db.execute("RELEASE g")
                        known.difference_update(f[0] for f in fresh)
                        bumps["reject:quota"] += len(items)
                        results.append(OVER_QUOTA)
                        continue
                    if n_new:
                        db.execute("INSERT INTO quota VALUES (?, ?, ?) ON CONFLICT(epoch, client) "
                                   "DO UPDATE SET n = n + excluded.n", (epoch, client, n_new))
                    db.execute("RELEASE g")
                bumps["accepted"] += n_new
                bumps["duplicates"] += len(stored) - n_new
                results.append(stored)
            self._bump_all(bumps)
        self.commits += 1
        self._buffered += bumps["accepted"]
        self.used_bytes = self._measure()
        return results

    def _known(self, ids: list[bytes]) -> set[bytes]:
        """The subset of ``ids`` already stored (in either generation)."""
        out = set()
        for i in range(0, len(ids), 10_000):
            chunk = ids[i:i + 10_000]
            marks = ",".join("?" * len(chunk))
            out.update(r[0] for r in self._db.execute(
                f"SELECT idempotency_id FROM seen WHERE idempotency_id IN ({marks}) UNION ALL "
                f"SELECT idempotency_id FROM seen_prev WHERE idempotency_id IN ({marks})", chunk + chunk))
        return out

    def rotate_seen(self, window_seconds: float, now: float | None = None) -> bool:
        """If the current generation of idempotency ids is ``window_seconds`` old, drop the previous one.

        Returns True if it rotated. Ids are then remembered for between one and two windows.
        """
        now = time.time() if now is None else now
        since = float(self._db.execute("SELECT value FROM meta WHERE name = 'seen_since'").fetchone()[0])
        if now - since < window_seconds:
            return False
        with self._tx():
            self._db.execute("DROP TABLE seen_prev")
            self._db.execute("ALTER TABLE seen RENAME TO seen_prev")
            self._db.execute(_SEEN_TABLE.format("seen"))
            self._db.execute("UPDATE meta SET value = ? WHERE name = 'seen_since'", (repr(now).encode(),))
        self.used_bytes = self._measure()
        return True

    def buffered(self) -> int:
        """Reports waiting for a batch (kept in memory; the table is only counted at open)."""
        return self._buffered

    def release(self, threshold: int, subsample_q: float = 1.0, crowd_threshold: int = 0,
                max_batch_bytes: int = 1 << 62) -> Released | None:
        """If at least ``threshold`` reports are buffered, turn all of them into one shuffled batch.

        In order: Poisson sub-sampling (keep each with probability ``subsample_q``), then the crowd
        threshold (drop every crowd id with fewer than ``crowd_threshold`` kept reports; reports
        without a crowd id form one crowd of their own), then a uniform shuffle; the shuffled list
        is cut into batches of at most ``max_batch_bytes``. Returns None when fewer than
        ``threshold`` reports are buffered (they are carried over).
        """
        with self._tx():
            if self._buffered < threshold or self._buffered == 0:
                return None
            thresholding = crowd_threshold > 0
            rows = self._db.execute("SELECT crowd, payload FROM buffer" if thresholding
                                    else "SELECT payload FROM buffer").fetchall()
            considered = len(rows)
            if subsample_q < 1.0:
                rows = [r for r, k in zip(rows, bernoulli_mask(len(rows), subsample_q).tolist()) if k]
            n_sub = considered - len(rows)
            n_crowd = 0
            if thresholding:
                sizes = Counter(r[0] or "" for r in rows)
                small = {c for c, m in sizes.items() if m < crowd_threshold}
                kept = [r[1] for r in rows if (r[0] or "") not in small]
                n_crowd = len(rows) - len(kept)
            else:
                kept = [r[0] for r in rows]
            del rows
            batch_ids = []
            shuffled = list(map(kept.__getitem__, secure_permutation(len(kept)).tolist()))
            del kept
            for lo, hi in _chunks(shuffled, max_batch_bytes):
                # Consecutive slices of one uniform permutation: each part is a uniform random subset.
                batch_id = uuid.UUID(bytes=os.urandom(16)).hex
                header = curator_pb2.IngestBatchRequest(batch_id=batch_id).SerializeToString()
                self._db.execute("INSERT INTO batches (batch_id, n, body) VALUES (?, ?, ?)",
                                 (batch_id, hi - lo, header + b"".join(shuffled[lo:hi])))
                batch_ids.append(batch_id)
            self._db.execute("DELETE FROM buffer")  # whole table: this thread is the only writer
            self._bump_all({"batches_released": len(batch_ids), "dropped_subsampled": n_sub,
                            "dropped_crowd_threshold": n_crowd})
        self._buffered = 0
        self.used_bytes = self._measure()
        return Released(batch_ids[0] if batch_ids else None, len(shuffled), considered, n_sub, n_crowd,
                        len(batch_ids))
    def pending_batches(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT batch_id FROM batches WHERE delivered = 0 ORDER BY rowid")]

    def batch(self, batch_id: str) -> tuple[int, bytes, bytes | None]:
        """(size, serialized IngestBatchRequest, serialized BatchPrivacy or None) of a pending batch."""
        return self._db.execute("SELECT n, body, privacy FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()

    def set_privacy(self, batch_id: str, privacy: bytes) -> None:
        with self._tx():
            self._db.execute("UPDATE batches SET privacy = ? WHERE batch_id = ?", (privacy, batch_id))

    def recent_batches(self, limit: int = 10) -> list[tuple[str, int, bool, bytes | None]]:
        return self._db.execute("SELECT batch_id, n, delivered, privacy FROM batches ORDER BY rowid DESC LIMIT ?",
                                (limit,)).fetchall()

    def delivered(self, batch_id: str) -> None:
        """Forget the content of a batch the curator has acknowledged (its metadata stays a while)."""
        with self._tx():
            n = self._db.execute("UPDATE batches SET body = NULL, delivered = 1 WHERE batch_id = ? AND delivered = 0",
                                 (batch_id,)).rowcount
            if n:
                size = self._db.execute("SELECT n FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()[0]
                self._bump_all({"batches_forwarded": 1, "reports_forwarded": size})
                self._db.execute("DELETE FROM batches WHERE delivered = 1 AND rowid NOT IN "
                                 "(SELECT rowid FROM batches WHERE delivered = 1 ORDER BY rowid DESC LIMIT ?)",
                                 (KEEP_DELIVERED,))
        self.used_bytes = self._measure()

    def prune_quota(self, epoch: int) -> None:
        """Delete the quota counters of epochs before ``epoch``."""
        with self._tx():
            self._db.execute("DELETE FROM quota WHERE epoch < ?", (epoch,))

    def count_reject(self, reason: str, n: int = 1) -> None:
        self._count({"reject:" + reason: n})

    def counters(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, value FROM counters"))

    def _count(self, bumps) -> None:
        with self._tx():
            self._bump_all(bumps)

    def _bump_all(self, bumps) -> None:
        self._db.executemany("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                             ((k, v, v) for k, v in bumps.items() if v))

    def _tx(self):
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
