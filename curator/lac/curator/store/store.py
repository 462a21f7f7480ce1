"""The curator's durable state.

Layout: the database and the ledger journal are this replica's (``state_dir``); the files every replica reads
(segments, words and release files) are under ``files_dir`` (``shared_dir``, by default ``state_dir``):

* ``curator.sqlite`` (WAL, ``synchronous=FULL``, mode 0600 in a 0700 directory), or the PostgreSQL database
  ``store`` names (the same tables, ``lac.curator.store.schema``): batches (with the
  range of accounting windows their reports were accepted in), the report ids of the replay
  window, quarantined reports, releases, the request id of each release (idempotent retries), the
  privacy ledger (one row per release and window it covers), counters, the exports of privatized
  reports (who, when, which windows, how many rows, the guarantee; never charged). Small rows only.
* ``.lac-curator-files`` (with a PostgreSQL store): the id the database recorded for this directory at its first
  start (``FilesElsewhere``): a replica started on another directory is refused rather than missing the others'
  files.
* ``segments/window=<w>/<batch>.parquet``: one immutable Parquet segment per ingested batch
  (``lac.curator.store.segments``): every distinct n-gram of every report with its raw count, in the
  report's first-occurrence order, so W, C and the vocabulary are applied at release time.
  Written with ``atomic_file`` (fsync) and the directory fsync'd before the batch's transaction
  commits; a batch is acknowledged only after that commit. Spark, DuckDB or pandas read the
  same files. ``migrate_npz`` converts the ``.npz`` segments of earlier versions.
* ``ledger.journal`` (in ``state_dir``, one per replica): every charge of the ledger again, appended after its
  commit, in a file that ``lac curator restore`` does not replace (``lac.curator.store.journal``), so restoring an
  older backup never hands spent budget back.
* ``releases/<id>.npz``: the released log-probabilities and items (nothing un-noised), written
  before the release row and its ledger entries commit; at start a file without a release row
  (a crash between the two) is removed, with a shared database only once older than ``ORPHAN_GRACE_SECONDS``.
* ``words/window=<w>/<batch>.parquet``: only while export is on (``keep_words``), each batch's
  reports' words, for ``lac.curator.store.export``, written like its segment and named by its batch
  row; ``purge_words`` deletes them (after the retention, and all of them when export is off).

Privacy: the report content beyond its words (report ids, local-privacy parameters) is not stored;
each report's n-grams with counts are (of the perturbed words, as the report had them, in order of
first occurrence: the report's text in another form), and its words as such only for export, as
above; report ids live in the database only for the replay window and are then deleted. Quarantined reports keep
their reason and a detail naming the rule, a position and a length (never the report's content), and
their sealed bytes (for diagnosis) only if they could not be opened (``OPENED``), the newest
``quarantine_max_rows`` of them only, so a stream of bad reports cannot fill the disk; reject counters keep the totals.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from lac.common.errors import AlreadyExists, DataLoss, ErrorReason, FailedPrecondition, RejectReason, Unavailable
from lac.common.files import atomic_file, fsync_dir, private_dir
from lac.common.privacy import Budget
from lac.common.storage import LowDiskSpace, free_bytes
from lac.common.v1 import reports_pb2
from lac.curator.base.ngrams import ReportItems
from lac.curator.store import journal, schema
from lac.curator.store import segments as seg
from lac.curator.store.export import WORDS_DIR, write_words
from lac.curator.store.ledger import refuse_overspending

log = logging.getLogger(__name__)

_NPZ_SEGMENT_FORMAT = 1

PROBE_BYTES = 1 << 20  # a test write: this much to a file, and a page-sized row to the database

ORPHAN_GRACE_SECONDS = 3600.0
"""With a PostgreSQL store (replicas share the files), a file the database does not name is removed at start only
once it was last modified this long ago: until then it may be another replica's segment or release written before
its commit (a write-to-commit gap is seconds; a storage stall beyond stall_timeout_seconds ends it as a failure).
Measured by the shared filesystem's modification times: keep the replicas' clocks within minutes of its own."""

FILES_MARKER = ".lac-curator-files"


def _load_npz_segment(path: Path) -> ReportItems:
    """A segment in the ``.npz`` format of earlier versions (vocabulary n-grams only)."""
    with np.load(path, allow_pickle=False) as z:
        if int(z["format"]) != _NPZ_SEGMENT_FORMAT:
            raise ValueError(f"{path}: unsupported segment format {int(z['format'])}")
        n = int(z["n_items"])
        items = tuple(z["items"].tobytes().decode("utf-8").split("\n")) if n else ()
        if len(items) != n:
            raise ValueError(f"{path}: corrupt segment")
        return ReportItems(
            z["indptr"].astype(np.int64), z["indices"].astype(np.int32), z["data"].astype(np.int32), items
        )


def _create_once(path: Path, text: str) -> str:
    """The text of the file ``path``, created durably with ``text`` unless it exists (two processes at once: one
    creates it, both read the same: a link fails where a rename would replace)."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
        with atomic_file(tmp) as f:
            f.write(text.encode() + b"\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        fsync_dir(path.parent)
    return path.read_text().strip()


@dataclass(frozen=True)
class Quarantined:
    reason: RejectReason
    detail: str
    sealed: bytes


OPENED = frozenset(
    {
        RejectReason.BAD_REPORT_ID,
        RejectReason.INVALID,
        RejectReason.MECHANISM_NOT_ALLOWED,
        RejectReason.EPSILON_TOO_LARGE,
        RejectReason.EPSILON_NOT_EXACT,
        RejectReason.EMBEDDING_MISMATCH,
        RejectReason.TOO_MANY_WORDS,
    }
)
"""Reasons a report is quarantined for after it was opened: its sealed bytes are not kept (to this curator's
key they are the report's words), only the reason and the detail."""

UNIT_FIELDS = ("window_seconds", "reports_per_window", "period_seconds", "windows_per_period")
"""What a state directory's stored windows, ledger and statements are counted in: recorded at its first start."""


def copy_to_postgres(state_dir: Path, url: str) -> list[TableCopy]:
    """``lac curator migrate``: copy the SQLite database of the (stopped) curator in ``state_dir`` into the empty
    PostgreSQL database ``url``, every row of every table, verified by counts and checksums before it commits;
    then mark the SQLite database as copied (``CuratorStore.moved_to``), so that a curator started on it refuses.
    The files (segments, releases, words, the ledger journal) stay in ``state_dir``."""
    if not (state_dir / "curator.sqlite").is_file():
        raise FileNotFoundError(f"{state_dir} holds no curator database (curator.sqlite); check --state-dir")
    source = CuratorStore(state_dir)  # brings it to the newest schema and the ledger in line with its journal
    try:
        copied = copy_into_postgres(source.database, url, schema.NAME, schema.steps, schema.TABLES)
        source.database.execute("INSERT INTO meta VALUES ('moved_to', ?)", (redact(url),))
    finally:
        source.close()
    return copied


class FilesElsewhere(FailedPrecondition):
    """The PostgreSQL store's files (segments, releases) are in another directory than this replica's files_dir."""


class PrivacyUnitChanged(FailedPrecondition):
    """The curator's configured privacy unit is not the one its state directory was created with."""


@dataclass(frozen=True)
class BatchResult:
    duplicate: bool
    accepted: int
    rejected: int
    rejects: dict[str, int]


class CuratorStore:
    """The curator's durable state: its database (``store``: SQLite in the state directory, or PostgreSQL) and its
    files (segments, releases, words: in ``shared_dir``, by default the state directory; the ledger journal: in
    the state directory). Replicas over one PostgreSQL database each open their own store on their own state
    directory and the same ``shared_dir``. Call from one thread at a time (the service uses
    ``lac.common.storage.StoreThread``)."""

    def __init__(
        self,
        state_dir: Path,
        quarantine_max_rows: int = 10_000,
        min_free_bytes: int = 0,
        keep_words: bool = False,
        store: str = "",
        shared_dir: Path | None = None,
    ):
        """``quarantine_max_rows``: quarantined reports kept for diagnosis (the most recent; counters keep totals).
        ``min_free_bytes``: writes are refused (``LowDiskSpace``) while the filesystem has less free space.
        ``keep_words``: keep each batch's reports' words for export (only while export is on).
        ``store``: the database, ``""`` for ``curator.sqlite`` in ``state_dir`` or a ``postgresql://`` URL.
        ``shared_dir``: where the segments, words and release files are (None: ``state_dir``)."""
        self.state_dir = private_dir(state_dir)
        self.files_dir = private_dir(shared_dir) if shared_dir is not None else self.state_dir
        self.quarantine_max_rows = quarantine_max_rows
        self.min_free_bytes = min_free_bytes
        self.keep_words = keep_words
        self.segments_dir = private_dir(self.files_dir / "segments")
        self.releases_dir = private_dir(self.files_dir / "releases")
        self.words_dir = private_dir(self.files_dir / WORDS_DIR) if keep_words else self.files_dir / WORDS_DIR
        self._db = open_database(state_dir / "curator.sqlite", store)
        try:
            self._db.migrate(schema.NAME, schema.steps(self._db))
            moved = self.moved_to()
            if moved is not None:
                raise FailedPrecondition(copied_elsewhere(self._db.where, moved, "curator", "curator's state"))
            if self._db.dialect != "sqlite":
                self._db.transaction(self._check_files_dir)
            self._remove_orphans()
            self._journal = state_dir / journal.JOURNAL_NAME
            journal.reconcile(self._db, state_dir)
        except BaseException:
            self._db.close()
            raise

    @property
    def database(self) -> Database:
        """The database under this store (for ``lac curator migrate``)."""
        return self._db

    def moved_to(self) -> str | None:
        """The PostgreSQL store this SQLite database was copied to by ``lac curator migrate`` (None: not copied)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'moved_to'").fetchone()
        return None if row is None else str(row[0])

    def _check_files_dir(self) -> None:
        """Within a transaction, with a PostgreSQL store: record ``files_dir`` as the store's (a random id in the
        database and in its ``FILES_MARKER`` file) at the first start, after checking it holds every file the
        database names (a state migrated from SQLite: its files moved there first); later, ``FilesElsewhere`` unless
        ``files_dir`` holds the recorded id."""
        marker = self.files_dir / FILES_MARKER
        row = self._db.execute("SELECT value FROM meta WHERE key = 'files_dir'").fetchone()
        if row is not None:
            recorded = json.loads(row[0])
            try:
                here = marker.read_text().strip()
            except FileNotFoundError:
                here = None
            if here != recorded["id"]:
                raise FilesElsewhere(
                    f"the curator's files (segments, releases) of {self._db.where} are in the directory first used "
                    f"as {recorded['path']} on {recorded['host']}, not in {self.files_dir} (it "
                    f"{'holds another id' if here else f'has no {FILES_MARKER}'}): start every replica with "
                    f"--shared-dir naming that directory (mounted at the same path on every machine)"
                )
            return
        named = [
            self.segments_dir / str(r[0])
            for r in self._db.execute("SELECT segment FROM batches WHERE segment IS NOT NULL")
        ] + [self.releases_dir / f"{r[0]}.npz" for r in self._db.execute("SELECT release_id FROM releases")]
        missing = [p for p in named if not p.is_file()]
        if missing:
            raise FilesElsewhere(
                f"{self._db.where} names {len(named)} segment and release file(s) and {len(missing)} of them are not "
                f"under {self.files_dir} (e.g. {missing[0]}): move the old state directory's segments/, releases/ "
                f"and words/ there (or point --shared-dir at it) before the first start on this database"
            )
        token = _create_once(marker, os.urandom(16).hex())
        value = {"id": token, "path": str(self.files_dir.resolve()), "host": socket.gethostname()}
        self._db.execute("INSERT INTO meta VALUES ('files_dir', ?)", (json.dumps(value),))

    def _unnamed(self, directory: Path, named: set[str]) -> list[Path]:
        """The files under ``directory`` whose relative paths are not in ``named`` and that may be removed: every one
        with SQLite (one process: the state directory's lock); with a shared database only those older than
        ``ORPHAN_GRACE_SECONDS`` (a younger one may be another replica's, written before its commit)."""
        if not directory.exists():
            return []
        cutoff = time.time() - ORPHAN_GRACE_SECONDS if self._db.dialect != "sqlite" else float("inf")
        out = []
        for p in directory.rglob("*"):
            try:
                if p.is_file() and str(p.relative_to(directory)) not in named and p.stat().st_mtime < cutoff:
                    out.append(p)
            except FileNotFoundError:  # renamed or removed by another replica meanwhile
                pass
        return out

    def _remove_orphans(self) -> None:
        """Files written for a batch or release whose commit never happened (crash), or that the database no
        longer names (a restored backup, a purge that stopped between its commit and its deletes). The database is
        read before the directories are listed, so a file committed meanwhile is new (within the grace)."""
        known = {r[0] for r in self._db.execute("SELECT segment FROM batches WHERE segment IS NOT NULL")}
        named = {r[0] for r in self._db.execute("SELECT words FROM batches WHERE words IS NOT NULL")}
        releases = {r[0] + ".npz" for r in self._db.execute("SELECT release_id FROM releases")}
        segments = self._unnamed(self.segments_dir, known)
        for p in self._unnamed(self.words_dir, named):
            p.unlink(missing_ok=True)
        gone = [w for w in named if not (self.words_dir / w).is_file()]
        if gone:  # backups hold no words: a restored batch's cannot be exported
            self._db.executemany("UPDATE batches SET words = NULL WHERE words = ?", ((w,) for w in gone))
            log.warning(
                "%d batch(es) have no words file (restored from a backup, which holds no words): they can no longer "
                "be exported",
                len(gone),
            )
        files = self._unnamed(self.releases_dir, releases)
        for p in segments + files:
            p.unlink(missing_ok=True)
        charged = {c.release_id + ".npz" for c in journal.read(self.state_dir / journal.JOURNAL_NAME)}
        restored_away = sum(p.name in charged for p in files)
        if segments:
            log.warning(
                "removed %d segment file(s) that no batch of the database names: written by a curator that stopped "
                "before the batch's commit (never acknowledged), or of batches stored after the backup this database "
                "was restored from (a shuffler that still holds them sends them again)",
                len(segments),
            )
        if len(files) > restored_away:
            log.warning(
                "removed %d release file(s) that were never committed (the curator stopped while writing them; not "
                "charged)",
                len(files) - restored_away,
            )
        if restored_away:
            log.warning(
                "removed %d release file(s) of releases made after the backup this database was restored from: "
                "their records are gone, their charges stay in the ledger (kept by ledger.journal)",
                restored_away,
            )

    def close(self) -> None:
        self._db.close()

    def keep_unit(self, unit: dict[str, float]) -> None:
        """Record ``unit`` (the deployment's ``UNIT_FIELDS``) at this state's first start; later, raise
        ``PrivacyUnitChanged`` if it differs from the recorded one. A state from before the record is checked
        against the quota and window its newest batch was stored under."""
        self._db.transaction(lambda: self._keep_unit(unit))  # two replicas starting at once record it once

    def _keep_unit(self, unit: dict[str, float]) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'privacy_unit'").fetchone()
        if row is not None:
            recorded = json.loads(row[0])
            changed = [f for f in UNIT_FIELDS if f in recorded and float(recorded[f]) != float(unit[f])]
        else:
            recorded, changed = {}, []
            last = self._db.execute(
                "SELECT privacy FROM batches WHERE privacy IS NOT NULL ORDER BY rowid DESC LIMIT 1"
            ).fetchone()
            if last is not None:
                p = reports_pb2.BatchPrivacy.FromString(last[0])
                recorded = {"window_seconds": p.window_seconds, "reports_per_window": p.reports_per_window}
                changed = [f for f in recorded if float(recorded[f]) != float(unit[f])]
        if changed:
            was = ", ".join(f"{f} = {recorded[f]:g}" for f in changed)
            now = ", ".join(f"{f} = {unit[f]:g}" for f in changed)
            raise PrivacyUnitChanged(
                f"{self.state_dir} was created with {was} but this curator is configured with {now}: its stored "
                f"accounting windows, its ledger and its statements are counted in the recorded privacy unit and "
                f"would be read in the new one. Start this curator with {was} (and the shufflers with the same), "
                f"or serve the new privacy unit from a fresh --state-dir (with fresh shuffler state); this one keeps "
                f"its ledger"
            )
        if row is None:
            self._db.execute(
                "INSERT INTO meta VALUES ('privacy_unit', ?)", (json.dumps({f: unit[f] for f in UNIT_FIELDS}),)
            )

    def keep_report_epsilon(self, epsilon: float | None, window: int) -> int | None:
        """The first accounting window from which every report stored was made at exactly ``epsilon`` per word
        (None: every window), for a curator that takes reports at exactly ``epsilon`` only (None: at any ε up to
        its largest). Recorded at this state's first start and whenever ``epsilon`` changes: a state that already
        holds batches then counts from the window after ``window`` (the current one, whose reports may have been
        stored under the earlier configuration)."""
        return self._db.transaction(lambda: self._keep_report_epsilon(epsilon, window))

    def _keep_report_epsilon(self, epsilon: float | None, window: int) -> int | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'report_epsilon'").fetchone()
        if row is not None:
            recorded = json.loads(row[0])
            if recorded["epsilon_per_word"] == epsilon:
                return recorded["since_window"]
            self._db.execute("DELETE FROM meta WHERE key = 'report_epsilon'")
        held = self._db.execute("SELECT 1 FROM batches LIMIT 1").fetchone() is not None
        since = window + 1 if held and epsilon is not None else None
        value = json.dumps({"epsilon_per_word": epsilon, "since_window": since})
        self._db.execute("INSERT INTO meta VALUES ('report_epsilon', ?)", (value,))
        return since

    def check_space(self) -> None:
        """``LowDiskSpace`` if the files' filesystem (``files_dir``) has less than ``min_free_bytes`` free."""
        if self.min_free_bytes:
            free = free_bytes(self.files_dir)
            if free < self.min_free_bytes:
                raise LowDiskSpace(
                    f"{free} bytes free for the curator's state, fewer than min_free_disk_bytes={self.min_free_bytes}"
                )

    def probe(self) -> None:
        """A test write of what ingest and releases write: a file (fsync'd, then removed) and a row
        (committed); raises what the storage raises."""
        self.check_space()
        path = self.segments_dir / ".probe"
        try:
            with atomic_file(path) as f:
                f.write(os.urandom(PROBE_BYTES))
        finally:
            path.unlink(missing_ok=True)
        self._db.transaction(
            lambda: self._db.execute(
                "INSERT INTO probe VALUES (1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET at = excluded.at, pad = excluded.pad",
                (time.time(), os.urandom(4096)),
            )
        )

    def has_batch(self, batch_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone() is not None

    def add_batch(
        self,
        batch_id: str,
        report_ids: list[bytes],
        count,
        quarantined: list[Quarantined],
        window_seconds: float,
        now: float | None = None,
        privacy: bytes | None = None,
        windows: tuple[int, int] = (0, 0),
    ) -> BatchResult:
        """Store one batch atomically. ``count(indexes)`` turns the reports kept (positions in
        ``report_ids``) into ``ReportItems``. Report ids seen within the window (or twice in the
        batch) are counted as ``replayed_report_id`` and dropped. Returns the outcome."""
        now = time.time() if now is None else now
        self.check_space()
        segment_name = seg.segment_name(batch_id, windows[1])

        def store() -> BatchResult:
            if self.has_batch(batch_id):
                return BatchResult(True, 0, 0, {})
            self.check_not_exported(batch_id, windows[1])
            self._db.execute("DELETE FROM report_ids WHERE seen_at < ?", (now - window_seconds,))
            keep, seen = [], self._replayed(report_ids)
            for i, rid in enumerate(report_ids):
                if rid in seen:
                    continue
                seen.add(rid)
                keep.append(i)
            rejects: dict[str, int] = {}  # by RejectReason's value (as stored and logged)
            for q in quarantined:
                rejects[str(q.reason)] = rejects.get(str(q.reason), 0) + 1
            if len(keep) < len(report_ids):
                rejects[str(RejectReason.REPLAYED_REPORT_ID)] = len(report_ids) - len(keep)
            words_name = None
            if keep:  # written again under the same name if the transaction runs again
                path = self.segments_dir / segment_name
                items = count(keep)
                seg.write(path, items, {"batch_id": batch_id, "first_window": windows[0], "last_window": windows[1]})
                fsync_dir(path.parent)
                fsync_dir(self.segments_dir)
                if self.keep_words and items.texts is not None:
                    words_name = segment_name
                    write_words(self.words_dir / words_name, items.texts)
                    fsync_dir((self.words_dir / words_name).parent)
                    fsync_dir(self.words_dir)
            self._db.executemany("INSERT INTO report_ids VALUES (?, ?)", ((report_ids[i], now) for i in keep))
            self._db.executemany(
                "INSERT INTO quarantine (batch_id, reason, detail, sealed, at) VALUES (?, ?, ?, ?, ?)",
                (
                    (batch_id, str(q.reason), q.detail, b"" if q.reason in OPENED else q.sealed, now)
                    for q in quarantined
                ),
            )
            if quarantined:
                self._db.execute(
                    "DELETE FROM quarantine WHERE id NOT IN (SELECT id FROM quarantine ORDER BY id DESC LIMIT ?)",
                    (self.quarantine_max_rows,),
                )
            rejected = sum(rejects.values())
            self._db.execute(
                "INSERT INTO batches (batch_id, accepted, rejected, segment, received_at, privacy, first_window, "
                "last_window, words) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, len(keep), rejected, segment_name if keep else None, now, privacy, *windows, words_name),
            )
            bump_counters(self._db, {"reports": len(keep), **{"reject:" + r: n for r, n in rejects.items()}})
            return BatchResult(False, len(keep), rejected, rejects)

        try:
            return self._db.transaction(store)
        except BaseException:
            if not self._maybe_committed(batch_id):
                (self.segments_dir / segment_name).unlink(missing_ok=True)
                (self.words_dir / segment_name).unlink(missing_ok=True)
            raise

    def _replayed(self, report_ids: list[bytes]) -> set[bytes]:
        """The subset of ``report_ids`` seen within the replay window (one query per 10,000: a round trip each on
        PostgreSQL)."""
        out: set[bytes] = set()
        for i in range(0, len(report_ids), 10_000):
            chunk = report_ids[i : i + 10_000]
            query = f"SELECT report_id FROM report_ids WHERE report_id IN ({','.join('?' * len(chunk))})"
            out.update(bytes(r[0]) for r in self._db.execute(query, chunk))
        return out

    def check_not_exported(self, batch_id: str, window: int) -> None:
        """FailedPrecondition (``ErrorReason.WINDOW_EXPORTED``) if the reports of ``window``, the last window of
        batch ``batch_id``, were exported: a later batch of it would make two exports of it differ by that batch."""
        row = self._db.execute(
            "SELECT export_id, at FROM exports WHERE first_window <= ? AND ? <= last_window ORDER BY at LIMIT 1",
            (window, window),
        ).fetchone()
        if row is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(row[1]))
            raise FailedPrecondition(
                f"batch {batch_id} belongs to accounting window {window} (its last), whose reports were exported at "
                f"{when} (export {row[0]}): a batch for an exported window is never accepted, so that its exports stay "
                f"equal; set it aside (do not retry it). Its reports arrived after the window settled: raise "
                f"forward_horizon_seconds if this recurs",
                error_reason=ErrorReason.WINDOW_EXPORTED,
            )

    def _maybe_committed(self, batch_id: str) -> bool:
        """After a failed commit: might the batch be stored after all? (Unknown counts as yes, and its
        segment is kept; if the batch is not stored the next start removes it as an orphan.)"""
        try:
            return self.has_batch(batch_id)
        except self._db.Error:
            return True

    def windows(self) -> tuple[int, int] | None:
        """(first, last) accounting window of the stored reports, None when nothing is stored."""
        lo, hi = self._db.execute(
            "SELECT MIN(first_window), MAX(last_window) FROM batches WHERE segment IS NOT NULL"
        ).fetchone()
        return None if lo is None else (int(lo), int(hi))

    def reports_by_window(self) -> dict[int, int]:
        """Exact report counts per batch's last window (operator view)."""
        return {
            int(w): int(n)
            for w, n in self._db.execute("SELECT last_window, SUM(accepted) FROM batches GROUP BY last_window")
        }

    def report_count(self, first_window: int, last_window: int) -> int:
        """Exact number of stored reports in the batches a release over those windows reads (operator view)."""
        (n,) = self._db.execute(
            "SELECT COALESCE(SUM(accepted), 0) FROM batches WHERE segment IS NOT NULL AND "
            "first_window >= ? AND last_window <= ?",
            (first_window, last_window),
        ).fetchone()
        return int(n)

    def noisy_count(self, first_window: int, last_window: int) -> tuple[float, float, float, float] | None:
        """The DP report count last released for exactly these windows: (value, Laplace scale, ε, unix time)."""
        row = self._db.execute(
            "SELECT value, scale, epsilon, at FROM noisy_counts WHERE first_window = ? AND last_window = ?",
            (first_window, last_window),
        ).fetchone()
        if row is None:
            return None
        value, scale, epsilon, at = (float(x) for x in row)
        return value, scale, epsilon, at

    def add_noisy_count(
        self, first_window: int, last_window: int, value: float, scale: float, charge: Budget, limit: Budget
    ) -> None:
        """Keep a DP report count and charge it to every window it covers, in one transaction that
        first re-checks the budget (nothing is kept or spent when it refuses)."""
        windows = list(range(first_window, last_window + 1))
        self.check_space()

        def keep() -> float:
            self.check_budget(windows, charge, limit)
            now = time.time()
            self._db.execute(
                "INSERT INTO noisy_counts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (first_window, last_window) DO UPDATE "
                "SET value = excluded.value, scale = excluded.scale, epsilon = excluded.epsilon, at = excluded.at",
                (first_window, last_window, value, scale, charge.epsilon, now),
            )
            self._charge(f"count:{first_window}-{last_window}", windows, charge, now)
            return now

        now = self._db.transaction(keep)
        journal.append(
            self._journal,
            [
                journal.Charge(
                    f"count:{first_window}-{last_window}", now, first_window, last_window, charge.epsilon, charge.delta
                )
            ],
        )

    def segment_paths(self, first_window: int | None = None, last_window: int | None = None) -> list[Path]:
        """The segment files of batches whose windows lie in [first_window, last_window], in ingest
        order; DataLoss if one of them is missing."""
        lo = -(1 << 62) if first_window is None else first_window
        hi = (1 << 62) if last_window is None else last_window
        rows = self._db.execute(
            "SELECT segment FROM batches WHERE segment IS NOT NULL AND first_window >= ? "
            "AND last_window <= ? ORDER BY rowid",
            (lo, hi),
        ).fetchall()
        paths = [self.segments_dir / name for (name,) in rows]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise DataLoss(
                f"segment {missing[0]} of an acknowledged batch is missing"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        return paths

    def export_batches(
        self, first_window: int, last_window: int
    ) -> list[tuple[int, int, int, bytes | None, str | None]]:
        """(first window, last window, accepted reports, the shuffler's serialized ``BatchPrivacy`` or None, its
        words file or None) of every stored batch whose last window lies in [first_window, last_window] (the batches
        an export reads: each belongs to its last window)."""
        return [
            (int(a), int(b), int(n), p, w)
            for a, b, n, p, w in self._db.execute(
                "SELECT first_window, last_window, accepted, privacy, words FROM batches WHERE segment IS NOT NULL "
                "AND last_window BETWEEN ? AND ? ORDER BY rowid",
                (first_window, last_window),
            )
        ]

    def purge_words(self, before_window: int | None = None) -> int:
        """Delete the words files of the batches whose last window is before ``before_window`` (None: all), the
        database first (a crash before the files go leaves orphans, removed at the next start); returns how many."""
        hi = (1 << 62) if before_window is None else before_window

        def forget() -> list[str]:
            names = [
                str(r[0])
                for r in self._db.execute(
                    "SELECT words FROM batches WHERE words IS NOT NULL AND last_window < ?", (hi,)
                )
            ]
            self._db.execute("UPDATE batches SET words = NULL WHERE words IS NOT NULL AND last_window < ?", (hi,))
            return names

        names = self._db.transaction(forget)
        for name in names:
            (self.words_dir / name).unlink(missing_ok=True)
        return len(names)

    def add_export(
        self,
        export_id: str,
        identity: str,
        first_window: int,
        last_window: int,
        rows: int,
        guarantee: str,
        batches: int | None = None,
    ) -> float:
        """Record an export of privatized reports (committed before any row is sent); returns its time.
        Exports are listed with the ledger but charge nothing: they are local DP, not central releases.
        ``batches``: how many batches the export read (``export_batches``); if one more was stored meanwhile the
        export is refused (Unavailable: read again), so that no batch gets in after an export without being in it."""
        self.check_space()

        def record() -> float:
            if batches is not None and len(self.export_batches(first_window, last_window)) != batches:
                raise Unavailable(
                    f"a batch of windows {first_window}..{last_window} was stored while the export read them; "
                    f"export again",
                    retry_after=1,
                )
            now = time.time()
            self._db.execute(
                "INSERT INTO exports VALUES (?, ?, ?, ?, ?, ?, ?)",
                (export_id, identity, now, first_window, last_window, rows, guarantee),
            )
            return now

        now = self._db.transaction(record)
        journal.append(
            self._journal, [journal.ExportRecord(export_id, identity, now, first_window, last_window, rows, guarantee)]
        )
        return now

    def exports(self) -> list[tuple[str, str, float, int, int, int]]:
        """Every export, oldest first: (export id, identity, unix time, first window, last window, rows)."""
        return [
            (str(e), str(i), float(t), int(a), int(b), int(n))
            for e, i, t, a, b, n in self._db.execute(
                "SELECT export_id, identity, at, first_window, last_window, rows FROM exports ORDER BY at, rowid"
            )
        ]

    def segment_words_unchecked(self) -> bool:
        """Whether segments written by an earlier version may still hold their reports' words (``strip_words``)."""
        return self._db.execute("SELECT 1 FROM meta WHERE key = 'segment_words'").fetchone() is not None

    def strip_segment_words(self) -> int:
        """Rewrite every segment that has the ``words`` column of earlier versions without it (with no curator
        running: ``lac curator migrate-segments``); returns how many."""
        done = 0
        for (name,) in self._db.execute("SELECT segment FROM batches WHERE segment LIKE '%.parquet'").fetchall():
            done += seg.strip_words(self.segments_dir / name)
        self._db.execute("DELETE FROM meta WHERE key = 'segment_words'")
        return done

    def migrate_npz(self) -> int:
        """Convert the ``.npz`` segments of earlier versions to Parquet; returns how many. Each is
        written and fsync'd, then the manifest switches to it in a transaction, then the old file goes."""
        done = 0
        for batch_id, name, first, last in self._db.execute(
            "SELECT batch_id, segment, first_window, last_window FROM batches WHERE segment LIKE '%.npz'"
        ).fetchall():
            old = self.segments_dir / name
            new = seg.segment_name(batch_id, last)
            seg.write(
                self.segments_dir / new,
                _load_npz_segment(old),
                {"batch_id": batch_id, "first_window": first, "last_window": last, "migrated_from": name},
            )
            fsync_dir((self.segments_dir / new).parent)
            self._db.execute("UPDATE batches SET segment = ? WHERE batch_id = ?", (new, batch_id))
            old.unlink()
            done += 1
        return done

    def counts(self) -> dict[str, int]:
        (batches,) = self._db.execute("SELECT COUNT(*) FROM batches").fetchone()
        (releases,) = self._db.execute("SELECT COUNT(*) FROM releases").fetchone()
        (quarantined,) = self._db.execute("SELECT COUNT(*) FROM quarantine").fetchone()
        (reports,) = self._db.execute("SELECT COALESCE(SUM(accepted), 0) FROM batches").fetchone()
        return {"batches": batches, "reports": int(reports), "releases": releases, "quarantined": quarantined}

    def rejects(self) -> dict[str, int]:
        return {
            k.split(":", 1)[1]: v
            for k, v in self._db.execute("SELECT name, value FROM counters")
            if k.startswith("reject:")
        }

    def quarantine(self, limit: int = 100) -> list[tuple[str, str, str, bytes]]:
        """Most recent quarantined reports: (batch_id, reason, detail, sealed bytes)."""
        return self._db.execute(
            "SELECT batch_id, reason, detail, sealed FROM quarantine ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()

    # -- releases and the ledger --------------------------------------------------------------

    def spent(self, windows: list[int] | None = None) -> dict[int, Budget]:
        """Budget spent per accounting window (every window with spending, or just ``windows``)."""
        rows = self._db.execute(
            "SELECT win, COALESCE(SUM(epsilon), 0), COALESCE(SUM(delta), 0) FROM window_ledger GROUP BY win"
        ).fetchall()
        spent = {int(w): Budget(e, min(d, 1 - 1e-16)) for w, e, d in rows}
        if windows is not None:
            spent = {w: spent.get(w, Budget(0.0)) for w in windows}
        return spent

    def data_dependent_releases(self, windows: list[int] | None = None) -> dict[int, int]:
        """Data-dependent (NOT DP) releases per window (every window that had one, or just ``windows``)."""
        rows = self._db.execute(
            "SELECT win, COUNT(*) FROM window_ledger WHERE data_dependent = 1 GROUP BY win"
        ).fetchall()
        counts = {int(w): int(n) for w, n in rows}
        if windows is not None:
            counts = {w: counts.get(w, 0) for w in windows}
        return counts

    def check_data_dependent(self, windows: list[int], cap: int) -> None:
        """FailedPrecondition if a window in ``windows`` had ``cap`` data-dependent releases already."""
        full = sorted(w for w, n in self.data_dependent_releases(windows).items() if n >= cap)
        if full:
            shown = ", ".join(map(str, full[:5])) + (f" and {len(full) - 5} more" if len(full) > 5 else "")
            raise FailedPrecondition(
                f"window(s) {shown} had {cap} data-dependent release(s) already, the most the operator allows "
                f"(data_dependent_releases_per_window): each draws fresh noise, so more of them could be averaged"
            )

    def check_budget(self, windows: list[int], charge: Budget, limit: Budget) -> None:
        """FailedPrecondition if charging every window in ``windows`` would exceed ``limit`` in any."""
        refuse_overspending(self.spent(windows), charge, limit)

    def add_release(
        self,
        release_id: str,
        record: bytes,
        items: tuple[str, ...],
        log_probs: np.ndarray,
        pseudo_counts: np.ndarray | None,
        windows: list[int],
        charge: Budget | None,
        limit: Budget,
        request_id: str | None = None,
        spec: str = "",
        data_dependent_cap: int | None = None,
        errors: Mapping[str, np.ndarray] | None = None,
    ) -> str:
        """Store a release (``record``: its serialized operator record; ``errors``: its error bars' arrays, by
        name, stored beside its log-probabilities) and, if ``charge`` is given,
        charge it to every window in ``windows`` (consecutive), in one transaction that first re-checks the
        budget (nothing is stored or spent when it refuses). A data-dependent release (NOT DP: no
        ``charge``) gives ``data_dependent_cap``: it is refused in a window that had that many already,
        else counted with every window it covers (ε = δ = 0). Returns the id of the release stored
        for ``request_id``: this one, or the one an earlier call with the same request id and
        ``spec`` stored (then nothing is written or spent; another ``spec``: AlreadyExists).

        The file is written (fsync'd) under its final name before the commit; a crash between the
        two leaves a file without a release row, which the next start removes, so a release's file
        and its ledger entries are there together or not at all."""
        path = self.releases_dir / f"{release_id}.npz"
        self.check_space()
        counted = charge if charge is not None else (None if data_dependent_cap is None else Budget(0.0))

        def store() -> tuple[str, float]:
            if request_id is not None:
                earlier = self._release_for_request(request_id, spec)
                if earlier is not None:
                    return earlier, 0.0
            if charge is not None:
                self.check_budget(windows, charge, limit)
            elif data_dependent_cap is not None:
                self.check_data_dependent(windows, data_dependent_cap)
            extra: dict[str, Any] = (
                {} if pseudo_counts is None else {"pseudo_counts": np.asarray(pseudo_counts, dtype=np.float64)}
            )
            extra |= {k: np.asarray(v, dtype=np.float64) for k, v in (errors or {}).items()}
            with atomic_file(path) as fh:
                np.savez(
                    fh,
                    log_probs=log_probs,
                    items=np.frombuffer("\n".join(items).encode("utf-8"), dtype=np.uint8),
                    **extra,
                )
            fsync_dir(self.releases_dir)
            self._db.execute("INSERT INTO releases VALUES (?, ?)", (release_id, record))
            if request_id is not None:
                self._db.execute("INSERT INTO release_requests VALUES (?, ?, ?)", (request_id, spec, release_id))
            now = time.time()
            if counted is not None:
                self._charge(release_id, windows, counted, now, data_dependent=charge is None)
            return release_id, now

        try:
            stored, now = self._db.transaction(store)
        except BaseException:
            if not self._release_maybe_committed(release_id):
                path.unlink(missing_ok=True)
            raise
        if stored != release_id:  # a concurrent call with the request id (a replica's) stored it first
            path.unlink(missing_ok=True)
            return stored
        if counted is not None and windows:  # after the commit: a crash before this is reconciled at start
            journal.append(
                self._journal,
                [
                    journal.Charge(
                        release_id,
                        now,
                        windows[0],
                        windows[-1],
                        counted.epsilon,
                        counted.delta,
                        request_id,
                        spec,
                        data_dependent=charge is None,
                    )
                ],
            )
        return release_id

    def _charge(self, release_id: str, windows: list[int], counted: Budget, now: float, data_dependent=False) -> None:
        """Within a transaction: the ledger's rows of one charge (one per window)."""
        self._db.executemany(
            "INSERT INTO window_ledger (release_id, win, epsilon, delta, at, data_dependent) VALUES (?, ?, ?, ?, ?, ?)",
            ((release_id, w, counted.epsilon, counted.delta, now, int(data_dependent)) for w in windows),
        )

    def _release_for_request(self, request_id: str, spec: str) -> str | None:
        """The release an earlier call with ``request_id`` made (None: none); AlreadyExists if that call
        asked for another release."""
        row = self._db.execute(
            "SELECT spec, release_id FROM release_requests WHERE request_id = ?", (request_id,)
        ).fetchone()
        if row is None:
            return None
        if row[0] != spec:
            raise AlreadyExists(
                f"request id {request_id!r} was used for release {row[1]} with other parameters; "
                f"use a new request id for a new release"
            )
        return row[1]

    def release_for_request(self, request_id: str, spec: str) -> str | None:
        """The id of the release an earlier call with ``request_id`` and ``spec`` made, None if there was
        none; AlreadyExists if that call asked for another release."""
        return self._release_for_request(request_id, spec)

    def _release_maybe_committed(self, release_id: str) -> bool:
        try:
            return self._db.execute("SELECT 1 FROM releases WHERE release_id = ?", (release_id,)).fetchone() is not None
        except self._db.Error:
            return True

    def releases_by_mechanism(self) -> dict[tuple[str, bool], int]:
        """The number of releases per (mechanism, differentially private), from their records."""
        record = "CAST(record AS TEXT)" if self._db.dialect == "sqlite" else "convert_from(record, 'UTF8')::jsonb"
        fields = (
            (f"json_extract({record}, '$.mechanism')", f"json_extract({record}, '$.differentially_private')")
            if self._db.dialect == "sqlite"
            else (f"{record} ->> 'mechanism'", f"({record} -> 'differentially_private')::boolean")
        )
        rows = self._db.execute(f"SELECT {fields[0]}, {fields[1]}, COUNT(*) FROM releases GROUP BY 1, 2")
        return {(str(m), bool(dp)): int(n) for m, dp, n in rows}

    def releases(self) -> list[bytes]:
        """Every release's serialized record, in creation order."""
        return [bytes(r[0]) for r in self._db.execute("SELECT record FROM releases ORDER BY rowid")]

    def release(
        self, release_id: str
    ) -> tuple[bytes, tuple[str, ...], np.ndarray, np.ndarray | None, dict[str, np.ndarray]] | None:
        """(serialized record, items, released log-probabilities, pseudo-counts or None, the error bars' arrays by
        name: empty for a release stored without), None if unknown."""
        row = self._db.execute("SELECT record FROM releases WHERE release_id = ?", (release_id,)).fetchone()
        if row is None:
            return None
        try:
            with np.load(self.releases_dir / f"{release_id}.npz") as z:
                items = tuple(z["items"].tobytes().decode("utf-8").split("\n"))
                pseudo = z["pseudo_counts"] if "pseudo_counts" in z.files else None
                errors = {k: z[k] for k in z.files if k.startswith("error_")}
                return row[0], items, z["log_probs"], pseudo, errors
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise DataLoss(f"the file of release {release_id} is missing or corrupt: {exc}") from exc
