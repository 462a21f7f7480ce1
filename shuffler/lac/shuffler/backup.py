"""Online backup and restore of a shuffler's state: the report log and the tokens file.

``backup`` copies the live report log with SQLite's online backup API through a read-only
connection: one read transaction, so the copy is one consistent snapshot (every commit before
it, none after) while the server keeps writing (WAL readers do not block the writer). The copy
is a self-contained database (rollback journal, no ``-wal``), checked with ``quick_check``;
``manifest.json`` is written last and names its SHA-256, so a backup without a manifest is
incomplete. The tokens file is copied beside it.

``restore`` verifies the manifest and the copy and installs both into a state directory whose
shuffler is stopped (one holding its lock, ``lac.common.statelock``, is refused). What a
restored shuffler does not know: reports acknowledged after the backup (they are lost unless
clients resend them), idempotency ids and quota use recorded after it (a resent report is stored
again; the curator drops reports it has seen by the id inside the seal), and batches delivered
after it (they are sent again under the same batch id, which the curator de-duplicates).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lac.common.backup import (
    copy_file,
    drop_sidecars,
    moved_to,
    read_backup,
    sha256_file,
    start_backup,
    verify,
    write_manifest,
)
from lac.common.files import fsync_dir, private_dir
from lac.common.statelock import StateDirLock

DB_NAME = "shuffler.sqlite"
TOKENS_NAME = "clients.tokens"
FORMAT = "lac-shuffler-backup/1"


def describe(db_path: Path) -> dict:
    """What a report log holds: buffered reports, undelivered batches, counters."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {
            "buffered_reports": db.execute(  # rows of released batches awaiting their acknowledgements are not
                "SELECT (SELECT COUNT(*) FROM buffer) - "
                "(SELECT COALESCE(SUM(n), 0) FROM batches WHERE seqs IS NOT NULL)"
            ).fetchone()[0],
            "batches_pending": db.execute("SELECT COUNT(*) FROM batches WHERE delivered = 0").fetchone()[0],
            "counters": dict(db.execute("SELECT name, value FROM counters ORDER BY name")),
        }
    finally:
        db.close()


def backup(state_dir: Path, dest: Path, tokens_file: Path | None = None) -> dict:
    """Copy the report log of ``state_dir`` (live or stopped) and its tokens file into ``dest``
    (created 0700, must not hold a backup already). Returns the manifest. Refused for a log copied to PostgreSQL
    (``lac shuffler migrate``): back that up with PostgreSQL's tools."""
    moved = moved_to(state_dir / DB_NAME, "name")
    if moved is not None:
        raise ValueError(
            f"{state_dir}'s report log was copied to the PostgreSQL store {moved} (lac shuffler migrate): back that "
            f"database up with pg_dump or PostgreSQL's continuous archiving, and the tokens file with it; the SQLite "
            f"log left there is no longer the shuffler's state"
        )
    manifest = {
        **start_backup(state_dir, dest, DB_NAME, FORMAT, "report log"),
        **describe(dest / DB_NAME),
        "tokens": None,
    }
    tokens = tokens_file if tokens_file is not None else state_dir / TOKENS_NAME
    if tokens.exists():
        copy_file(tokens, dest / TOKENS_NAME)
        manifest["tokens"] = {"file": TOKENS_NAME, "sha256": sha256_file(dest / TOKENS_NAME)}
    write_manifest(dest, manifest)
    return manifest


def restore(source: Path, state_dir: Path, tokens_file: Path | None = None, force: bool = False) -> dict:
    """Install the backup in ``source`` as the state of ``state_dir`` (its shuffler must be stopped).

    Refuses (``StateDirLocked``) a state directory a running shuffler holds, even with ``force``, and
    holds its lock meanwhile. Refuses one that already holds a report log (or tokens file) unless ``force``.
    Returns the backup's manifest.
    """
    manifest, db = read_backup(source, FORMAT)
    tokens_copy = manifest.get("tokens")
    if tokens_copy:
        verify(source / tokens_copy["file"], tokens_copy["sha256"])
    target = state_dir / DB_NAME
    tokens_target = tokens_file if tokens_file is not None else state_dir / TOKENS_NAME
    with StateDirLock(state_dir, "lac shuffler restore"):  # StateDirLocked while a shuffler serves from it
        existing = [p for p in (target, tokens_target if tokens_copy else None) if p is not None and p.exists()]
        if existing and not force:
            raise FileExistsError(
                f"{', '.join(map(str, existing))} exists; stop that shuffler and pass --force to "
                f"replace its state with the backup"
            )
        drop_sidecars(state_dir, DB_NAME)
        copy_file(db, target)
        if tokens_copy:
            private_dir(tokens_target.parent)
            copy_file(source / tokens_copy["file"], tokens_target)
        fsync_dir(state_dir)
    return manifest
