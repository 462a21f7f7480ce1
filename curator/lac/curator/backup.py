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
does not has lost them), releases made after it are missing from the ledger, so their privacy
spending is forgotten: restore only the latest backup, and count the releases made since
(``lac curator releases`` on the old machine, or the analysts' records) against the budget by
hand. Not in the backup: the key ring (``key_dir``, back it up separately and securely) and the
public prior cache (``prior/``, rebuilt from the public corpus at start).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lac.common.backup import copy_file, drop_sidecars, read_backup, sha256_file, start_backup, verify, write_manifest
from lac.common.files import fsync_dir, private_dir
from lac.common.statelock import StateDirLock

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
    hold a backup already). Returns the manifest."""
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


def restore(source: Path, state_dir: Path, force: bool = False) -> dict:
    """Install the backup in ``source`` as the state of ``state_dir`` (its curator must be stopped).

    Refuses (``StateDirLocked``) a state directory a running curator holds, even with ``force``, and
    holds its lock meanwhile. Refuses one that already holds a curator database unless ``force``
    (then its database is replaced; its segment and release files that the backup does not name are
    removed at the next start as orphans). Returns the backup's manifest."""
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
        if target.exists():  # --force: no database while files change, so an interrupted restore is visible
            target.unlink()
        drop_sidecars(state_dir, DB_NAME)
        for rel in files:
            private_dir((state_dir / rel).parent)
            copy_file(source / rel, state_dir / rel)
        for sub in {Path(rel).parent for rel in files}:
            fsync_dir(state_dir / sub)
        copy_file(db, target)
        fsync_dir(state_dir)
    return manifest
