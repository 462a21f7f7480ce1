"""Online backup and restore of a curator's state: its database, segments and release files.

``backup`` takes one consistent snapshot of ``curator.sqlite`` (batches, the replay window's
report ids, quarantine, release records, the privacy ledger, counters) with SQLite's online
backup API (``lac.common.backup.snapshot_sqlite``) while the server keeps serving, then copies
exactly the files that snapshot names: the segment of every batch and the file of every release
in it. Both kinds are immutable once committed (a batch's segment and a release's file are
written before the transaction that names them), so files copied after the snapshot are the
ones it refers to; files of batches or releases committed later are not copied (the snapshot
does not know them). ``manifest.json``, written last, names every file's SHA-256.

``restore`` verifies everything against the manifest and installs it into a state directory
whose curator is stopped (one holding its lock, ``lac.common.statelock``, is refused): files
first, the database last (an interrupted restore leaves no database, so it can simply be run
again). A restored curator holds what the backup held: batches ingested after it are missing (a
shuffler that still has them delivers them again, and batch ids de-duplicate; a shuffler that
does not has lost them), and so are the records of releases made after it. Their privacy
spending is not forgotten: the ledger journal (``lac.curator.store.journal``), which restore never
replaces, still holds it, and the next start puts it back into the ledger with the request ids
(a retried release is refused, not run and charged again). Before replacing a database, restore
first copies its charges into the journal. Restoring into another machine's state directory,
carry the old one's ``ledger.journal`` over (``carry_journal``). Not in the backup: the key ring
(``key_dir``, back it up separately and securely), the public prior cache (``prior/``,
rebuilt from the public corpus at start) and the batches' words files (``words/``, kept for export
only: a restored curator cannot export the windows in the backup).
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
from lac.common.database import SqliteDatabase
from lac.common.files import fsync_dir, private_dir
from lac.common.statelock import StateDirLock
from lac.curator.store import journal

__all__ = ["backup", "restore", "describe", "FORMAT"]

DB_NAME = "curator.sqlite"
FORMAT = "lac-curator-backup/1"


def describe(db_path: Path) -> dict:
    """What a curator database holds: batches, reports, releases, quarantined reports, ledger rows."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)

    def one(sql: str) -> int:
        return int(db.execute(sql).fetchone()[0])

    try:
        return {
            "batches": one("SELECT COUNT(*) FROM batches"),
            "reports": one("SELECT COALESCE(SUM(accepted), 0) FROM batches"),
            "releases": one("SELECT COUNT(*) FROM releases"),
            "quarantined": one("SELECT COUNT(*) FROM quarantine"),
            "ledger_rows": one("SELECT COUNT(*) FROM window_ledger"),
        }
    finally:
        db.close()


def _files(db_path: Path) -> list[str]:
    """The files (relative to the state directory) a curator database refers to."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        segments = [
            f"segments/{name}"
            for (name,) in db.execute("SELECT segment FROM batches WHERE segment IS NOT NULL ORDER BY rowid")
        ]
        releases = [f"releases/{rid}.npz" for (rid,) in db.execute("SELECT release_id FROM releases ORDER BY rowid")]
    finally:
        db.close()
    return segments + releases


def backup(state_dir: Path, dest: Path) -> dict:
    """Copy the curator state in ``state_dir`` (live or stopped) into ``dest`` (created 0700; must not
    hold a backup already). Returns the manifest. Refused for a state whose database was copied to PostgreSQL
    (``lac curator migrate``): back that up with PostgreSQL's tools."""
    moved = moved_to(state_dir / DB_NAME, "key")
    if moved is not None:
        raise ValueError(
            f"{state_dir}'s database was copied to the PostgreSQL store {moved} (lac curator migrate): back that "
            f"database up with pg_dump or PostgreSQL's continuous archiving, and {state_dir}'s segments/ and "
            f"releases/ with it; the SQLite database left there is no longer the curator's state"
        )
    database = start_backup(state_dir, dest, DB_NAME, FORMAT, "curator database")
    files = {}
    for rel in _files(dest / DB_NAME):
        src = state_dir / rel
        if not src.is_file():
            raise FileNotFoundError(
                f"{src}: named by the curator's database but missing (DATA_LOSS in the live "
                f"curator too); the backup is incomplete"
            )
        copy_file(src, dest / rel)
        files[rel] = sha256_file(dest / rel)
    for sub in {Path(rel).parent for rel in files}:
        fsync_dir(dest / sub)
    manifest = {
        **database,
        "files": files,
        **describe(dest / DB_NAME),
    }
    write_manifest(dest, manifest)
    return manifest


def restore(source: Path, state_dir: Path, force: bool = False, carry_journal: Path | None = None) -> dict:
    """Install the backup in ``source`` as the state of ``state_dir`` (its curator must be stopped).

    Refuses (``StateDirLocked``) a state directory a running curator holds, even with ``force``, and
    holds its lock meanwhile. Refuses one that already holds a curator database unless ``force``
    (then its database is replaced; its segment and release files that the backup does not name are
    removed at the next start as orphans). The charges of the replaced database, and those of the
    ledger journal ``carry_journal`` (another state directory's), are kept in this one's journal and
    put back into the ledger at the next start. Returns the backup's manifest, with
    ``kept_charges``: how many charges the journal holds that the backup's ledger does not."""
    manifest, db = read_backup(source, FORMAT)
    files = manifest["files"]
    for rel, digest in files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"{source}: the manifest names a file outside the state directory: {rel!r}")
        verify(source / rel, digest)
    named = set(_files(db))
    if named != set(files):
        raise ValueError(
            f"{source}: the manifest's files are not the ones its database names "
            f"({len(named ^ set(files))} differ); the backup is damaged"
        )
    with StateDirLock(state_dir, "lac curator restore"):  # StateDirLocked while a curator serves from it
        target = state_dir / DB_NAME
        if target.exists() and not force:
            raise FileExistsError(
                f"{target} exists; stop that curator and pass --force to replace its state with the backup"
            )
        if carry_journal is not None:
            journal.carry(carry_journal, state_dir)
        if target.exists():  # --force: keep its charges, then no database while files change
            old = sqlite3.connect(target, isolation_level=None)
            try:
                journal.reconcile(SqliteDatabase.wrap(old, str(target)), state_dir)
            finally:
                old.close()
            target.unlink()
        drop_sidecars(state_dir, DB_NAME)
        for rel in files:
            private_dir((state_dir / rel).parent)
            copy_file(source / rel, state_dir / rel)
        for sub in {Path(rel).parent for rel in files}:
            fsync_dir(state_dir / sub)
        copy_file(db, target)
        fsync_dir(state_dir)
        restored = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            in_backup = {c.key for c in journal.database_charges(SqliteDatabase.wrap(restored, str(target)))}
        finally:
            restored.close()
    kept = [c for c in journal.read(state_dir / journal.JOURNAL_NAME) if c.key not in in_backup]
    return {**manifest, "kept_charges": len(kept)}
