"""The shuffler's durable state: buffered reports, released batches awaiting delivery,
quota counters per accounting window.

SQLite in WAL mode with ``synchronous=FULL`` (``shuffler.sqlite`` in the state directory), or the
PostgreSQL database ``store`` names (the same tables, ``lac.shuffler.schema``): a commit returns only
once it is durable, so a report acknowledged to a client survives a crash. ``append_groups`` commits
many Submit calls in one transaction (group commit: one fsync for all of them); every write is one
serializable transaction (``lac.common.database``).

What is stored where:
* ``buffer``: the sealed payload (re-serialized from its known fields only, framed as an
  ``IngestBatchRequest.reports`` entry), the optional crowd id, the keyed hash of the client
  (so a batch takes at most one report per client, ``lac.shuffler.policy``) and the accounting
  window it was accepted in. ``seq`` (arrival order), the client hash and the window never leave
  this file (a batch carries only the range of its reports' windows). A row stays here, payload
  and all, until every batch of the release that took it is acknowledged: the payloads are written
  once, at ingest, and never copied.
* ``batches``: a released batch as the seqs of its reports in shuffled order (``seqs``, packed
  64-bit integers) and the release it is part of (``release_id``: the batches of one release
  are cut from one permutation). Its request is built when it is sent: its id, then the rows'
  payloads read in that order (none of the seqs), so a redelivery after a crash sends the same
  batch id with the same content. A report in a batch whose ``seqs`` are kept is *held*: not
  buffered, never taken again. Once the curator has acknowledged every batch of a release, its
  rows are deleted and the batches' ``seqs`` dropped, in the transaction of the last
  acknowledgement; a crash in between leaves the delivered batches' reports held. A batch the curator
  refused for good is a *dead letter* (``dead``: its refusal, ``dead_at``): no longer pending, its
  reports held until the operator retries it (pending again) or drops it (its rows and its record
  deleted, as if the curator had taken it, but counted as dropped).
* ``quota``: reports per (accounting window, keyed hash of the client id); rows of past
  windows are deleted when a window ends.
* ``period_use``: with a cap on windows per client per period, per client (keyed hash) and period how
  many windows it stored reports in and the last one, nothing more (which windows they were is not
  kept); rows of past periods are deleted.
* ``seen`` / ``seen_prev``: idempotency ids in two generations. ``rotate_seen`` drops the older
  one and starts a new one once a window has passed, so an id is remembered for at least one
  window and at most two, and the tables stay bounded. Nothing links an id to a report.

The key of the client hashes is not in the database: it is ``client.key`` in the state directory (32 random
bytes, 0600), which backups leave out, so a copy of the log, even with the tokens file's client ids, cannot tell
whose hashes it holds. The database records the key's id (``meta.client_key_id``, a hash of the key) and
refuses to open with another key or none (``ClientKeyError``). On PostgreSQL too the key stays in each
replica's state directory: every replica over one database must hold the same ``client.key`` (the operator
copies the first one's). A log written when the key was kept inside (``meta.client_key``) moves it out at its
next start and rewrites its pages (SQLite's ``VACUUM``; PostgreSQL's ``VACUUM FULL meta``), leaving no copy;
an earlier SQLite log's windows of the period cap become counts (schema step 3) and its pages are rewritten too.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from lac.common.database import (
    Database,
    TableCopy,
    bump_counters,
    copied_elsewhere,
    copy_into_postgres,
    open_database,
    redact,
)
from lac.common.errors import RejectReason
from lac.common.files import atomic_file, fsync_dir, private_dir
from lac.shuffler import schema, wire
from lac.shuffler.lease import Lease, open_lease
from lac.shuffler.policy import Row, Selection, select_batch

log = logging.getLogger(__name__)

T = TypeVar("T")

# Outcomes of a group in ``append_groups`` (not counter labels: those are RejectReason.QUOTA and .LOG_FULL).
OVER_QUOTA = "over_quota"
OVER_PERIOD_CAP = "over_period_cap"
LOG_FULL = "log_full"
KEEP_DELIVERED = 50  # metadata rows of delivered batches kept for `status`
KEY_FILE = "client.key"  # the key of the client hashes, in the state directory and never in the database
PROBE_BYTES = 64 * 1024  # size of the write that tests whether the log is writable again


class ClientKeyError(RuntimeError):
    """The client key file is missing, or is not the key the report log's client hashes were made with."""


def key_id(key: bytes) -> bytes:
    """What the report log records of its client key: enough to recognise it, nothing to recompute a hash with."""
    return hashlib.sha256(b"lac-shuffler client key id\0" + key).digest()[:16]


def write_key(path: Path, key: bytes) -> None:
    """Write a client key file (0600, fsync'd, renamed into place)."""
    with atomic_file(path) as f:
        f.write(key)
    fsync_dir(path.parent)


def copy_to_postgres(state_dir: Path, url: str) -> list[TableCopy]:
    """``lac shuffler migrate``: copy the SQLite report log of the (stopped) shuffler in ``state_dir`` into the empty
    PostgreSQL database ``url``, every row of every table, verified by counts and checksums before it commits; then
    mark the SQLite log as copied (``ReportLog.moved_to``), so that a shuffler started on it refuses. The client key
    stays in ``state_dir`` (the database records only its id)."""
    if not (state_dir / "shuffler.sqlite").is_file():
        raise FileNotFoundError(f"{state_dir} holds no report log (shuffler.sqlite); check --state-dir")
    source = ReportLog(state_dir)  # brings it to the newest schema
    try:
        copied = copy_into_postgres(source.database, url, schema.NAME, schema.steps, schema.TABLES)
        source.set_meta("moved_to", redact(url).encode())
    finally:
        source.close()
    return copied


@dataclass(frozen=True)
class Released:
    batch_id: str | None  # None: every taken report was dropped by sub-sampling/crowd threshold
    size: int
    considered: int
    dropped_subsampled: int
    dropped_crowd: int
    parts: int = 1  # batches the release was split into (each at most max_batch_bytes, but see oversized)
    oversized: int = 0  # batches over max_batch_bytes: min_batch of its reports did not fit in that limit


@dataclass(frozen=True)
class StoredBatch:
    """A released batch awaiting delivery."""

    n: int
    body: bytes  # serialized IngestBatchRequest without its privacy field (batch id and payloads, in shuffled order)
    privacy: bytes | None  # serialized BatchPrivacy once computed
    first_window: int
    last_window: int
    distinct_clients: bool


class ReportLog:
    """Durable buffer + released batches. Not thread-safe: use from one thread (except
    ``count_reject``, which only counts in memory and may be called from any thread).

    A failed write (full disk, I/O error, a PostgreSQL gone) raises the database's error or ``OSError`` and
    leaves the log as it was before the transaction; the in-memory counts change only after a commit.
    ``store``: the database, ``""`` for ``shuffler.sqlite`` in ``state_dir`` or a ``postgresql://`` URL.
    """

    def __init__(self, state_dir: Path, store: str = ""):
        # Reject counters are kept in memory and saved with the next write transaction, so a flood of
        # bad requests costs no fsync each (and counting never fails when the disk does).
        self._unsaved: Counter[str] = Counter()
        self._unsaved_lock = threading.Lock()
        self._taken: Counter[str] = Counter()
        self.state_dir = state_dir
        private_dir(state_dir)
        self.path = state_dir / "shuffler.sqlite"
        self._db = open_database(self.path, store)
        if self._db.dialect == "sqlite":
            self._db.execute("PRAGMA cache_size=-65536")  # 64 MiB: the idempotency index is random-access
            # Checkpoint the WAL into the database every ~40 MiB instead of every 4 MiB: halves ingest cost.
            self._db.execute("PRAGMA wal_autocheckpoint=10000")
        try:
            # An earlier log's windows of the period cap become counts (schema step 3): its pages are rewritten.
            rewrite = "period_windows" in self._db.tables()
            self._db.migrate(schema.NAME, schema.steps(self._db))
            moved = self.moved_to()
            if moved is not None:
                raise RuntimeError(copied_elsewhere(self._db.where, moved, "shuffler", "report log"))
            self._page_size = (
                int(self._db.execute("PRAGMA page_size").fetchone()[0]) if self._db.dialect == "sqlite" else 0
            )
            self._tx(self._first_meta)
            self._client_key = self._open_client_key(rewrite)
        except BaseException:
            self._db.close()
            raise
        self._buffered = 0
        self._per_client: Counter[bytes] = Counter()  # buffered reports per client (in memory)
        self._anonymous = 0
        for client, n in self._db.execute("SELECT client, COUNT(*) FROM buffer GROUP BY client"):
            self._count_buffered(client, n)
        held = sorted(self._held())
        for i in range(0, len(held), 10_000):  # rows of released batches are not buffered
            chunk = held[i : i + 10_000]
            for (client,) in self._db.execute(
                f"SELECT client FROM buffer WHERE seq IN ({','.join('?' * len(chunk))})", chunk
            ):
                self._count_buffered(client, -1)
        self.used_bytes = self._measure()
        self.commits = 0  # group commits since open (one fsync each)
        # Replicas over one PostgreSQL database store reports into one buffer: their counts are the database's
        # (``recount``), not what this process added.
        self.shared = self._db.dialect == "postgresql"
        self._counts = (0, 0)  # (buffered, takeable) as last read from the database
        self.recount()
        self.lease: Lease = open_lease(self._db, state_dir, schema.NAME)  # who releases (lac.shuffler.lease)

    def _first_meta(self) -> None:
        """Within a transaction: the idempotency ids' generation start and the log's id (``store_id``), made at the
        first start (once, with replicas starting together)."""
        if self._db.execute("SELECT 1 FROM meta WHERE name = 'seen_since'").fetchone() is None:
            self._db.execute("INSERT INTO meta VALUES ('seen_since', ?)", (repr(time.time()).encode(),))
        if self._db.execute("SELECT 1 FROM meta WHERE name = 'store_id'").fetchone() is None:
            self._db.execute("INSERT INTO meta VALUES ('store_id', ?)", (os.urandom(16).hex().encode(),))

    def _open_client_key(self, rewrite: bool) -> bytes:
        """The key of the client hashes, from ``client.key`` (made at the first start); ``ClientKeyError`` if the
        file is missing or holds another key than the one recorded. A key kept in the database (earlier layout)
        is moved to the file, and the database rewritten (``rewrite`` too) so that no copy of it is left in a page.

        Replicas over one PostgreSQL database each read their own ``state_dir``'s file: the operator copies the
        first replica's ``client.key`` to the others; one with another key, or none once a key is recorded, refuses
        to start (a replica racing the first to make one removes the key it made)."""
        path = self.state_dir / KEY_FILE
        inside = self.get_meta("client_key")
        if inside is not None:
            if path.exists() and path.read_bytes() != inside:
                raise ClientKeyError(f"{path} is not the key inside {self._db.where}; move it aside and start again")
            write_key(path, inside)
            self._tx(lambda: self._move_key_out(inside))
            log.info("the client key moved out of %s into %s (once; the database is rewritten)", self._db.where, path)
            rewrite = True
        if rewrite:
            self._rewrite()
        made = not path.exists()
        if made:
            if self.get_meta("client_key_id") is not None:
                raise ClientKeyError(
                    f"{path} is missing, and {self._db.where}'s client hashes were made with the key it held: put the "
                    f"old state directory's client.key there (backups leave it out; every replica over one PostgreSQL "
                    f"database holds the same one), or restore the backup with `lac shuffler restore "
                    f"--new-client-key`, which forgets every client's quota use"
                )
            write_key(path, os.urandom(32))
        key = path.read_bytes()
        if self._tx(lambda: self._record_key_id(key)) != key_id(key):
            if made and path.read_bytes() == key:  # another replica recorded its new key first: ours was never used
                path.unlink()
            raise ClientKeyError(
                f"{path} is not the key {self._db.where}'s client hashes were made with: put the old state "
                f"directory's client.key there (every replica over one PostgreSQL database holds the same one), or "
                f"restore the backup with `lac shuffler restore --new-client-key`"
            )
        return key

    def _move_key_out(self, key: bytes) -> None:
        """Within a transaction: an earlier layout's key in ``meta`` replaced by its id."""
        self._db.execute("DELETE FROM meta WHERE name = 'client_key'")
        self._db.execute("INSERT INTO meta VALUES ('client_key_id', ?) ON CONFLICT (name) DO NOTHING", (key_id(key),))

    def _record_key_id(self, key: bytes) -> bytes:
        """Within a transaction: the recorded client key's id, ``key``'s if none was recorded yet."""
        recorded = self.get_meta("client_key_id")
        if recorded is None:
            recorded = key_id(key)
            self._db.execute("INSERT INTO meta VALUES ('client_key_id', ?)", (recorded,))
        return recorded

    def _rewrite(self) -> None:
        """Rewrite the database's pages, so that no copy of deleted rows is left in them (SQLite: the file and its
        WAL; PostgreSQL: the meta table that held the key, its old rows' space given back)."""
        if self._db.dialect == "sqlite":
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            self._db.execute("VACUUM FULL meta")

    @property
    def store_id(self) -> str:
        """The log's random id, made once: the same for every replica over one database, and which idempotency ids
        it knows (``GetShards`` gives it to the SDK)."""
        return (self.get_meta("store_id") or b"").decode()

    @property
    def database(self) -> Database:
        """The database under the log (for ``lac shuffler migrate``)."""
        return self._db

    def moved_to(self) -> str | None:
        """The PostgreSQL store this SQLite log was copied to by ``lac shuffler migrate`` (None: not copied)."""
        value = self.get_meta("moved_to")
        return None if value is None else value.decode()

    def _count_buffered(self, client: bytes | None, n: int) -> None:
        self._buffered += n
        if client is None:
            self._anonymous += n
        else:
            self._per_client[client] += n
            if self._per_client[client] <= 0:
                del self._per_client[client]

    def close(self) -> None:
        self.lease.release()
        self._db.close()

    def client_key(self, client_id: str) -> bytes:
        """Keyed hash of a client id: what the quota table and the buffer store instead of the id."""
        return hmac.new(self._client_key, client_id.encode(), hashlib.sha256).digest()[:16]

    def _measure(self) -> int:
        """Bytes the log's rows take: SQLite's used pages, or PostgreSQL's tables with their indexes and TOAST."""
        if self._db.dialect == "sqlite":
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
            return int((pages - free) * self._page_size)
        marks = ", ".join("?" * len(schema.TABLES))
        (used,) = self._db.execute(
            f"SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            f"WHERE c.relnamespace = current_schema()::regnamespace AND c.relname IN ({marks})",
            schema.TABLES,
        ).fetchone()
        return int(used)

    def append_groups(
        self, groups, window: int, quota: int, max_bytes: int, period_cap: int = 0, period_windows: int = 1
    ) -> list[list[bool] | str]:
        """Store the reports of many Submit calls in one fsync'd transaction.

        ``groups``: list of (items, client_key or None), items = [(idempotency_id, crowd, payload)].
        A client may store at most ``quota`` reports per accounting ``window``, and reports in at most
        ``period_cap`` windows (0: no cap) of the period of ``period_windows`` windows holding ``window``.
        Returns per group a list of bools (True = stored, False = duplicate), or ``OVER_QUOTA`` /
        ``OVER_PERIOD_CAP`` (nothing of that group stored) or ``LOG_FULL``.
        """
        if self.used_bytes >= max_bytes:
            self.count_reject(RejectReason.LOG_FULL, sum(len(g[0]) for g in groups))
            return [LOG_FULL] * len(groups)
        db = self._db

        def store() -> tuple[list[list[bool] | str], list[tuple[bytes | None, int]]]:
            results: list[list[bool] | str] = []
            bumps: Counter[str] = Counter()
            added: list[tuple[bytes | None, int]] = []
            known = self._known([it[0] for items, _ in groups for it in items])
            for items, client in groups:
                metered = client is not None
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
                db.executemany(
                    "INSERT INTO buffer (crowd, payload, client, win) VALUES (?, ?, ?, ?)",
                    ((c, wire.batch_entry(p), client, window) for _, c, p in fresh),
                )
                n_new = len(fresh)
                if metered:
                    row = db.execute(
                        "SELECT n FROM window_quota WHERE win = ? AND client = ?", (window, client)
                    ).fetchone()
                    over = OVER_QUOTA if (row[0] if row else 0) + n_new > quota else None
                    if over is None and n_new and period_cap:
                        over = self._count_window(client, window, period_cap, period_windows)
                    if over is not None:
                        db.execute("ROLLBACK TO SAVEPOINT g")
                        db.execute("RELEASE SAVEPOINT g")
                        known.difference_update(f[0] for f in fresh)
                        reason = RejectReason.QUOTA if over == OVER_QUOTA else RejectReason.PERIOD_CAP
                        bumps["reject:" + reason] += len(items)
                        results.append(over)
                        continue
                    if n_new:
                        db.execute(
                            "INSERT INTO window_quota VALUES (?, ?, ?) ON CONFLICT (win, client) "
                            "DO UPDATE SET n = window_quota.n + excluded.n",
                            (window, client, n_new),
                        )
                    db.execute("RELEASE SAVEPOINT g")
                bumps["accepted"] += n_new
                bumps["duplicates"] += len(stored) - n_new
                if n_new:
                    added.append((client, n_new))
                results.append(stored)
            self._bump_all(bumps)
            self._save_unsaved()
            return results, added

        results, added = self._tx(store)
        self.commits += 1
        for client, n in added:
            self._count_buffered(client, n)
        self.used_bytes = self._measure()
        return results

    def _count_window(self, client: bytes, window: int, cap: int, period_windows: int) -> str | None:
        """Within a transaction: count ``window`` against ``client``'s cap of ``cap`` windows in its period, or
        ``OVER_PERIOD_CAP``. Only the count and the last window are kept, so a window other than the last counts
        as a new one (windows come in order; a clock set back can only refuse more)."""
        period = window // period_windows
        row = self._db.execute(
            "SELECT windows, last_window FROM period_use WHERE period = ? AND client = ?", (period, client)
        ).fetchone()
        if row is not None and row[1] == window:
            return None
        if (row[0] if row else 0) >= cap:
            return OVER_PERIOD_CAP
        self._db.execute(
            "INSERT INTO period_use VALUES (?, ?, 1, ?) ON CONFLICT (period, client) "
            "DO UPDATE SET windows = period_use.windows + 1, last_window = excluded.last_window",
            (period, client, window),
        )
        return None

    def _known(self, ids: list[bytes]) -> set[bytes]:
        """The subset of ``ids`` already stored (in either generation)."""
        out: set[bytes] = set()
        for i in range(0, len(ids), 10_000):
            chunk = ids[i : i + 10_000]
            marks = ",".join("?" * len(chunk))
            out.update(
                r[0]
                for r in self._db.execute(
                    f"SELECT idempotency_id FROM seen WHERE idempotency_id IN ({marks}) UNION ALL "
                    f"SELECT idempotency_id FROM seen_prev WHERE idempotency_id IN ({marks})",
                    chunk + chunk,
                )
            )
        return out

    def rotate_seen(self, window_seconds: float, now: float | None = None) -> bool:
        """If the current generation of idempotency ids is ``window_seconds`` old, drop the previous one.

        Returns True if it rotated. Ids are then remembered for between one and two windows.
        """
        now = time.time() if now is None else now

        def rotate() -> bool:  # the start read in the transaction: two replicas rotate once
            since = float(self._db.execute("SELECT value FROM meta WHERE name = 'seen_since'").fetchone()[0])
            if now - since < window_seconds:
                return False
            self._db.execute("DROP TABLE seen_prev")
            self._db.execute("ALTER TABLE seen RENAME TO seen_prev")
            self._db.execute(schema.seen_table(self._db, "seen"))
            self._db.execute("UPDATE meta SET value = ? WHERE name = 'seen_since'", (repr(now).encode(),))
            return True

        if not self._tx(rotate):
            return False
        self.used_bytes = self._measure()
        return True

    def buffered(self) -> int:
        """Reports waiting for a batch (on SQLite kept in memory, the table counted only at open; on PostgreSQL the
        database's count at the last ``recount``)."""
        return self._counts[0] if self.shared else self._buffered

    def takeable(self) -> int:
        """Reports the next batch could take: one per buffered client plus every anonymous one (on PostgreSQL at
        the last ``recount``)."""
        return self._counts[1] if self.shared else len(self._per_client) + self._anonymous

    def recount(self) -> None:
        """On PostgreSQL, where other replicas store reports too, read ``buffered`` and ``takeable`` from the database
        in one transaction: the buffer's rows and clients counted by the server, less the rows held by pending
        releases and the clients all of whose rows are held. On SQLite nothing to do: this process's counts are
        the log's."""
        if not self.shared:
            return

        def count() -> tuple[int, int]:
            total, clients, anonymous = self._db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT client), COUNT(*) - COUNT(client) FROM buffer"
            ).fetchone()
            held: Counter[bytes | None] = Counter()
            for chunk in _chunks(sorted(self._held())):
                marks = ",".join("?" * len(chunk))
                for client, n in self._db.execute(
                    f"SELECT client, COUNT(*) FROM buffer WHERE seq IN ({marks}) GROUP BY client", chunk
                ):
                    held[None if client is None else bytes(client)] += n
            held_anonymous = held.pop(None, 0)
            emptied = 0  # clients every buffered row of whom is held
            for chunk in _chunks(list(held)):
                marks = ",".join("?" * len(chunk))
                for client, n in self._db.execute(
                    f"SELECT client, COUNT(*) FROM buffer WHERE client IN ({marks}) GROUP BY client", chunk
                ):
                    emptied += n == held[bytes(client)]
            buffered = total - sum(held.values()) - held_anonymous
            return int(buffered), int(clients - emptied + anonymous - held_anonymous)

        self._counts = self._tx(count)

    def release(
        self,
        threshold: int,
        subsample_q: float = 1.0,
        crowd_threshold: int = 0,
        max_batch_bytes: int = 1 << 62,
        reserve: int = 0,
    ) -> Released | None:
        """If ``threshold`` + ``reserve`` is reached, turn one report per buffered client, except a uniformly
        random ``reserve`` of them, into shuffled batches.

        The policy (``lac.shuffler.policy.select_batch``) decides over the rows' keys and sizes; this
        stores its outcome in one transaction: the batches (their seqs in shuffled order, with their
        windows), which holds the taken reports' rows (no payload is read or copied), and the deletion
        of the taken reports the policy dropped; the clients' other reports stay buffered. None below
        the threshold.
        """
        if self.takeable() - reserve < max(threshold, 1):
            return None

        def take() -> tuple[list[Row], Selection, list[str]] | None:
            held = self._held()
            rows = [
                Row._make(r)
                for r in self._db.execute("SELECT seq, client, win, crowd, length(payload) FROM buffer")
                if r[0] not in held
            ]
            sel: Selection | None = select_batch(
                rows, threshold, subsample_q, crowd_threshold, max_batch_bytes, reserve
            )
            if sel is None:
                return None
            batch_ids = [uuid.UUID(bytes=os.urandom(16)).hex for _ in sel.parts]
            self._db.executemany(
                "INSERT INTO batches (batch_id, n, seqs, release_id, first_window, last_window, distinct_clients) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        batch_id,
                        len(part),
                        _pack(part),
                        batch_ids[0],
                        sel.first_window,
                        sel.last_window,
                        int(sel.distinct_clients),
                    )
                    for batch_id, part in zip(batch_ids, sel.parts)
                ),
            )
            released = {seq for part in sel.parts for seq in part}
            self._delete_rows([seq for seq in sel.taken if seq not in released])  # dropped: sub-sampling, crowds
            self._bump_all(
                {
                    "batches_released": len(batch_ids),
                    "dropped_subsampled": sel.dropped_subsampled,
                    "dropped_crowd_threshold": sel.dropped_crowd,
                }
            )
            return rows, sel, batch_ids

        taken = self._tx(take)
        if taken is None:
            return None
        rows, sel, batch_ids = taken
        by_client = {r.seq: r.client for r in rows}
        for seq in sel.taken:
            self._count_buffered(by_client[seq], -1)
        self.recount()
        self.used_bytes = self._measure()
        return Released(
            batch_ids[0] if batch_ids else None,
            sel.size,
            sel.considered,
            sel.dropped_subsampled,
            sel.dropped_crowd,
            len(batch_ids),
            sel.oversized,
        )

    def _held(self) -> set[int]:
        """The seqs of reports in released batches whose release is not wholly acknowledged."""
        out: set[int] = set()
        for (packed,) in self._db.execute("SELECT seqs FROM batches WHERE seqs IS NOT NULL"):
            out.update(_unpack(packed).tolist())
        return out

    def _delete_rows(self, seqs) -> None:
        """Within a transaction: delete these rows of the buffer (in key order: neighbouring pages)."""
        seqs = sorted(seqs)
        for i in range(0, len(seqs), 10_000):
            chunk = seqs[i : i + 10_000]
            self._db.execute(f"DELETE FROM buffer WHERE seq IN ({','.join('?' * len(chunk))})", chunk)

    def get_meta(self, name: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return bytes(row[0]) if row else None

    def set_meta(self, name: str, value: bytes) -> None:
        self._tx(lambda: self._set_meta(name, value))

    def _set_meta(self, name: str, value: bytes) -> None:
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value)
        )

    def pending_batches(self) -> list[str]:
        """The batches to deliver, oldest first (dead letters are not)."""
        return [
            r[0]
            for r in self._db.execute(
                "SELECT batch_id FROM batches WHERE delivered = 0 AND dead IS NULL ORDER BY rowid"
            )
        ]

    def dead_letter(self, batch_id: str, refusal: str) -> None:
        """Set a pending batch aside as a dead letter: the curator refused it for good (``refusal``)."""

        def set_aside() -> None:
            done = self._db.execute(
                "UPDATE batches SET dead = ?, dead_at = ? WHERE batch_id = ? AND delivered = 0 AND dead IS NULL "
                "RETURNING batch_id",
                (refusal, time.time(), batch_id),
            ).fetchall()
            self._bump_all({"batches_dead_lettered": len(done)})

        self._tx(set_aside)

    def dead_letters(self) -> list[tuple[str, int, str, float, bytes | None]]:
        """(batch id, reports, refusal, since, privacy statement) of every dead letter, oldest first."""
        return self._db.execute(
            "SELECT batch_id, n, dead, dead_at, privacy FROM batches WHERE dead IS NOT NULL AND delivered = 0 "
            "ORDER BY rowid"
        ).fetchall()

    def _select_dead(self, batch_ids: list[str] | None) -> list[tuple[str, int, str]]:
        """Within a transaction: (id, reports, release) of the dead letters named (all: None); KeyError with the
        list of ids that are not dead letters."""
        rows = self._db.execute(
            "SELECT batch_id, n, release_id FROM batches WHERE dead IS NOT NULL AND delivered = 0 ORDER BY rowid"
        ).fetchall()
        if batch_ids is None:
            return rows
        known = {r[0] for r in rows}
        if unknown := [b for b in batch_ids if b not in known]:
            raise KeyError(unknown)
        wanted = set(batch_ids)
        return [r for r in rows if r[0] in wanted]

    def retry_dead(self, batch_ids: list[str] | None = None) -> list[tuple[str, int]]:
        """Make dead letters (those named; all: None) pending again; (id, reports) of each. KeyError for an id
        that is not a dead letter."""

        def retry() -> list[tuple[str, int, str]]:
            chosen = self._select_dead(batch_ids)
            self._db.executemany(
                "UPDATE batches SET dead = NULL, dead_at = NULL WHERE batch_id = ?", [(b,) for b, _, _ in chosen]
            )
            return chosen

        return [(b, n) for b, n, _ in self._tx(retry)]

    def drop_dead(self, batch_ids: list[str] | None = None) -> list[tuple[str, int]]:
        """Delete dead letters (those named; all: None) and their reports, which are then never delivered;
        (id, reports) of each. KeyError for an id that is not a dead letter."""

        def drop() -> list[tuple[str, int, str]]:
            chosen = self._select_dead(batch_ids)
            for batch_id, _, release_id in chosen:
                (packed,) = self._db.execute("SELECT seqs FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
                self._delete_rows(_unpack(packed).tolist() if packed is not None else [])
                self._db.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))
                self._finish_release(release_id)
            self._bump_all(
                {
                    "batches_dropped_dead_letter": len(chosen),
                    "reports_dropped_dead_letter": sum(n for _, n, _ in chosen),
                }
            )
            return chosen

        chosen = self._tx(drop)
        self.used_bytes = self._measure()
        return [(b, n) for b, n, _ in chosen]

    def batch(self, batch_id: str) -> StoredBatch:
        """A pending batch: its size, request body (read now from the buffered rows, in the batch's shuffled
        order), privacy statement (once computed) and windows."""
        n, packed, privacy, first, last, distinct = self._db.execute(
            "SELECT n, seqs, privacy, first_window, last_window, distinct_clients FROM batches "
            "WHERE batch_id = ? AND delivered = 0",
            (batch_id,),
        ).fetchone()
        order = _unpack(packed)
        keys = np.sort(order).tolist()  # read in key order (neighbouring pages), then put in shuffled order
        found: dict[int, bytes] = {}
        for i in range(0, len(keys), 10_000):
            chunk = keys[i : i + 10_000]
            found.update(
                (seq, bytes(payload))
                for seq, payload in self._db.execute(
                    f"SELECT seq, payload FROM buffer WHERE seq IN ({','.join('?' * len(chunk))})", chunk
                )
            )
        if len(found) != n or len(order) != n:
            raise RuntimeError(f"report log damaged: batch {batch_id} has {len(found)} of its {n} reports")
        body = wire.batch_header(batch_id) + b"".join([found[seq] for seq in order.tolist()])
        return StoredBatch(n, body, None if privacy is None else bytes(privacy), first, last, bool(distinct))

    def set_privacy(self, batch_id: str, privacy: bytes) -> None:
        self._tx(lambda: self._db.execute("UPDATE batches SET privacy = ? WHERE batch_id = ?", (privacy, batch_id)))

    def recent_batches(self, limit: int = 10) -> list[tuple[str, int, bool, bytes | None, str | None]]:
        """(id, reports, delivered, statement, refusal of a dead letter) of the newest batches, newest first."""
        return self._db.execute(
            "SELECT batch_id, n, delivered, privacy, dead FROM batches ORDER BY rowid DESC LIMIT ?", (limit,)
        ).fetchall()

    def delivered(self, batch_id: str) -> None:
        """Note that the curator acknowledged a batch. Once every batch of its release is acknowledged, the
        release's rows are deleted and its batches keep only their metadata (the newest ones, a while)."""

        def note() -> None:
            row = self._db.execute(
                "UPDATE batches SET delivered = 1 WHERE batch_id = ? AND delivered = 0 RETURNING n, release_id",
                (batch_id,),
            ).fetchall()
            if row:
                ((size, release_id),) = row
                self._bump_all({"batches_forwarded": 1, "reports_forwarded": size})
                self._finish_release(release_id)
                self._db.execute(
                    "DELETE FROM batches WHERE delivered = 1 AND seqs IS NULL AND rowid NOT IN "
                    "(SELECT rowid FROM batches WHERE delivered = 1 ORDER BY rowid DESC LIMIT ?)",
                    (KEEP_DELIVERED,),
                )

        self._tx(note)
        self.used_bytes = self._measure()

    def _finish_release(self, release_id: str) -> None:
        """Within a transaction: once no batch of a release waits (each delivered or dropped), delete its rows
        and keep only its batches' metadata."""
        waiting = self._db.execute(
            "SELECT 1 FROM batches WHERE release_id = ? AND delivered = 0 LIMIT 1", (release_id,)
        ).fetchone()
        if waiting is None:
            parts = self._db.execute(
                "SELECT seqs FROM batches WHERE release_id = ? AND seqs IS NOT NULL", (release_id,)
            ).fetchall()
            self._delete_rows(np.concatenate([_unpack(p) for (p,) in parts]).tolist() if parts else [])
            self._db.execute("UPDATE batches SET seqs = NULL WHERE release_id = ?", (release_id,))

    def prune_quota(self, window: int, period_windows: int = 1) -> None:
        """Delete the quota counters of accounting windows before ``window``, and the windows counted
        against the cap in periods (of ``period_windows`` windows) before ``window``'s."""

        def prune() -> None:
            self._db.execute("DELETE FROM window_quota WHERE win < ?", (window,))
            self._db.execute("DELETE FROM period_use WHERE period < ?", (window // period_windows,))

        self._tx(prune)

    def count_reject(self, reason: RejectReason, n: int = 1) -> None:
        """Count ``n`` rejected reports (in memory; saved by the next write). Any thread."""
        with self._unsaved_lock:
            self._unsaved["reject:" + reason] += n

    def counters(self) -> dict[str, int]:
        """Every counter, saved or not yet saved."""
        out = Counter({str(k): int(v) for k, v in self._db.execute("SELECT name, value FROM counters")})
        with self._unsaved_lock:
            out.update(self._unsaved)
        return dict(out)

    def probe(self, nbytes: int = PROBE_BYTES) -> None:
        """A real durable write of ``nbytes`` (replacing the previous probe's): raises if the log cannot
        be written. Also saves the counters kept in memory."""

        def write() -> None:
            self._set_meta("write_probe", os.urandom(nbytes))
            self._save_unsaved()

        self._tx(write)
        self.used_bytes = self._measure()

    def save_counters(self) -> None:
        """Save the counters kept in memory (one transaction, only if there are any)."""
        with self._unsaved_lock:
            if not self._unsaved:
                return
        self._tx(self._save_unsaved)

    def free_bytes(self) -> int | None:
        """Space the log can still grow into: free space of the state directory's filesystem (for an
        unprivileged writer) plus the free pages inside the database, which new writes reuse. None on
        PostgreSQL, whose disk is the server's (it answers a full disk with an error, a storage failure)."""
        if self._db.dialect != "sqlite":
            return None
        st = os.statvfs(self.state_dir)
        free_pages = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        return st.f_bavail * st.f_frsize + free_pages * self._page_size

    def _save_unsaved(self) -> None:
        """Within a transaction: add the in-memory counters (given back if the transaction fails)."""
        with self._unsaved_lock:
            taken, self._unsaved = self._unsaved, Counter()
        self._taken.update(taken)
        self._bump_all(taken)

    def _bump_all(self, bumps) -> None:
        bump_counters(self._db, bumps)

    def _tx(self, fn: Callable[[], T]) -> T:
        """``fn()`` in one transaction (``Database.transaction``). The in-memory counters it took
        (``_save_unsaved``) are given back if it fails, and before it runs again after a conflict."""

        def attempt() -> T:
            self._give_back()
            return fn()

        try:
            return self._db.transaction(attempt)
        except BaseException:
            self._give_back()
            raise
        finally:
            self._taken = Counter()

    def _give_back(self) -> None:
        if self._taken:
            with self._unsaved_lock:
                self._unsaved.update(self._taken)
            self._taken = Counter()


def _chunks(items: list, size: int = 10_000):
    """``items`` in slices of ``size`` (the most values one statement's ``IN (...)`` takes here)."""
    return (items[i : i + size] for i in range(0, len(items), size))


def _pack(seqs) -> bytes:
    """A batch's seqs as stored: little-endian 64-bit integers."""
    return np.asarray(seqs, dtype="<i8").tobytes()


def _unpack(packed: bytes) -> np.ndarray:
    return np.frombuffer(packed, dtype="<i8")
