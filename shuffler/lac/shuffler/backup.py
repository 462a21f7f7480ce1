"""Online backup and restore of a shuffler's state: the report log and the tokens file.

``backup`` copies the live report log with SQLite's online backup API through a read-only
connection: one read transaction, so the copy is one consistent snapshot (every commit before
it, none after) while the server keeps writing (WAL readers do not block the writer). The copy
is a self-contained database (rollback journal, no ``-wal``), checked with ``quick_check``;
``manifest.json`` is written last and names its SHA-256, so a backup without a manifest is
incomplete. The tokens file is copied beside it.

The key of the client hashes (``client.key``, ``lac.shuffler.reportlog``) is not in a backup: with it
and the tokens file's client ids, a copy would say whose hashes it holds (which clients reported in the
current window and how often, and with a period cap how many windows each used). The manifest names the
key's id instead, and ``restore`` needs the key itself: the target's own ``client.key`` (restoring where
it was made), ``client_key`` (the old state directory's file, kept apart from backups), or
``new_client_key``: a new key, with which the restored hashes match no client, so the restore forgets
every client's quota and period-cap use (in the current window a client may store its quota again, and
its windows of the current period are counted afresh) and a restored buffered report may share a batch
with a newer report of the same client.

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
from lac.shuffler.reportlog import KEY_FILE, key_id, write_key

DB_NAME = "shuffler.sqlite"
TOKENS_NAME = "clients.tokens"
FORMAT = "lac-shuffler-backup/1"


def describe(db_path: Path) -> dict:
    """What a report log holds: buffered reports, undelivered batches (dead letters among them), counters."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {
            "buffered_reports": db.execute(  # rows of released batches awaiting their acknowledgements are not
                "SELECT (SELECT COUNT(*) FROM buffer) - "
                "(SELECT COALESCE(SUM(n), 0) FROM batches WHERE seqs IS NOT NULL)"
            ).fetchone()[0],
            "batches_pending": db.execute("SELECT COUNT(*) FROM batches WHERE delivered = 0").fetchone()[0],
            "batches_dead_letter": (
                db.execute("SELECT COUNT(*) FROM batches WHERE delivered = 0 AND dead IS NOT NULL").fetchone()[0]
                if "dead" in {r[1] for r in db.execute("PRAGMA table_info(batches)")}
                else 0
            ),
            "counters": dict(db.execute("SELECT name, value FROM counters ORDER BY name")),
            "client_key_id": (row[0].hex() if (row := _meta(db, "client_key_id")) else None),
        }
    finally:
        db.close()


def _meta(db: sqlite3.Connection, name: str) -> tuple | None:
    return db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()


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


def _key_to_install(manifest: dict, state_dir: Path, client_key: Path | None, new_client_key: bool) -> bytes | None:
    """The client key ``restore`` installs (None: the target's own, or a new one), or ValueError when it has no
    key the backup's client hashes were made with."""
    wanted = manifest.get("client_key_id")
    if client_key is not None and new_client_key:
        raise ValueError("give --client-key FILE or --new-client-key, not both")
    if wanted is None or new_client_key:  # a log that kept its key inside (it moves out at the next start)
        return None
    if client_key is not None:
        key = client_key.read_bytes()
        if key_id(key).hex() != wanted:
            raise ValueError(f"{client_key} is not the client key of this backup's report log (id {wanted[:16]})")
        return key
    own = state_dir / KEY_FILE
    if own.exists() and key_id(own.read_bytes()).hex() == wanted:
        return None
    raise ValueError(
        f"backups leave out the key of the report log's client hashes, and {own} is "
        f"{'another key' if own.exists() else 'missing'}: pass --client-key FILE (the old state directory's "
        f"client.key) to keep every client's quota and period-cap use, or --new-client-key to forget them"
    )


def restore(
    source: Path,
    state_dir: Path,
    tokens_file: Path | None = None,
    force: bool = False,
    client_key: Path | None = None,
    new_client_key: bool = False,
) -> dict:
    """Install the backup in ``source`` as the state of ``state_dir`` (its shuffler must be stopped), with the key
    of its client hashes: ``state_dir``'s own, ``client_key`` (a key file), or a new one (``new_client_key``,
    which forgets every client's quota and period-cap use; see the module docstring).

    Refuses (``StateDirLocked``) a state directory a running shuffler holds, even with ``force``, and
    holds its lock meanwhile. Refuses one that already holds a report log (or tokens file) unless ``force``,
    and (ValueError) a restore without the client key. Returns the backup's manifest.
    """
    manifest, db = read_backup(source, FORMAT)
    tokens_copy = manifest.get("tokens")
    if tokens_copy:
        verify(source / tokens_copy["file"], tokens_copy["sha256"])
    target = state_dir / DB_NAME
    tokens_target = tokens_file if tokens_file is not None else state_dir / TOKENS_NAME
    key = _key_to_install(manifest, state_dir, client_key, new_client_key)
    with StateDirLock(state_dir, "lac shuffler restore"):  # StateDirLocked while a shuffler serves from it
        existing = [p for p in (target, tokens_target if tokens_copy else None) if p is not None and p.exists()]
        if existing and not force:
            raise FileExistsError(
                f"{', '.join(map(str, existing))} exists; stop that shuffler and pass --force to "
                f"replace its state with the backup"
            )
        drop_sidecars(state_dir, DB_NAME)
        copy_file(db, target)
        _forget_store_id(target)
        if new_client_key:
            _forget_clients(target)
            (state_dir / KEY_FILE).unlink(missing_ok=True)  # the shuffler makes a new one at its start
        elif key is not None:
            write_key(state_dir / KEY_FILE, key)
        if tokens_copy:
            private_dir(tokens_target.parent)
            copy_file(source / tokens_copy["file"], tokens_target)
        fsync_dir(state_dir)
    return manifest


def _forget_store_id(db_path: Path) -> None:
    """A restored log is another log than the one backed up, which may still run: it makes a new ``store_id`` at
    its start, so the SDK never takes the two for replicas of one log (and passes a call that may have been stored
    in one to the other)."""
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        db.execute("DELETE FROM meta WHERE name = 'store_id'")
    finally:
        db.close()


def _forget_clients(db_path: Path) -> None:
    """For a new client key: delete the quota and period-cap rows (their hashes match no client any more) and the
    old key's id."""
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        for table in ("window_quota", "period_use", "period_windows"):  # period_windows: a log before schema step 3
            if _has_table(db, table):
                db.execute(f"DELETE FROM {table}")
        db.execute("DELETE FROM meta WHERE name IN ('client_key_id', 'client_key')")
        db.execute("COMMIT")
    finally:
        db.close()


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None
