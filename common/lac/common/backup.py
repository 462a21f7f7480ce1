"""Building blocks of the services' online backups (``lac shuffler backup``, ``lac curator backup``).

``snapshot_sqlite`` copies a live SQLite database with SQLite's online backup API through a
read-only connection: one read transaction, so the copy is one consistent snapshot (every commit
before it, none after) while the server keeps writing (WAL readers do not block the writer), and
the live database is never written to or checkpointed. The copy is a self-contained database
(rollback journal, no ``-wal``), checked with ``quick_check`` and fsync'd. ``copy_file`` copies a
file durably; ``sha256_file`` and ``verify`` are for the manifests, which are written last: a
backup without its manifest is incomplete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lac.common.files import atomic_file, fsync_dir, private_dir

__all__ = [
    "sha256_file",
    "snapshot_sqlite",
    "start_backup",
    "copy_file",
    "verify",
    "write_manifest",
    "read_manifest",
    "read_backup",
    "drop_sidecars",
    "moved_to",
    "migrate_command",
]

MANIFEST = "manifest.json"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot_sqlite(source: Path, dest: Path) -> float:
    """Copy the database ``source`` (live or not) to ``dest`` as one consistent snapshot; returns the
    unix time the snapshot began."""
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_RDWR | os.O_CREAT, 0o600))
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(partial, isolation_level=None)
    try:
        started = time.time()
        src.backup(dst)  # pages=-1: the whole database in one step, i.e. one read transaction
        dst.execute("PRAGMA journal_mode=DELETE")  # a self-contained file
        check = dst.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"the copy of {source} fails quick_check: {check}")
    finally:
        dst.close()
        src.close()
    with open(partial, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(partial, dest)
    return started


def start_backup(state_dir: Path, dest: Path, db_name: str, fmt: str, what: str) -> dict[str, Any]:
    """Snapshot ``state_dir/db_name`` (live or stopped) into ``dest`` (created 0700; must not hold a
    backup already); returns the manifest's entries for the database (format, time, SHA-256, size)."""
    source = state_dir / db_name
    if not source.exists():
        raise FileNotFoundError(f"{source}: no {what} to back up")
    if (dest / MANIFEST).exists() or (dest / db_name).exists():
        raise FileExistsError(f"{dest} already holds a backup; choose a new directory")
    private_dir(dest)
    started = snapshot_sqlite(source, dest / db_name)
    return {
        "format": fmt,
        "created_unix": started,
        "source": str(source.resolve()),
        "database": db_name,
        "database_sha256": sha256_file(dest / db_name),
        "database_bytes": (dest / db_name).stat().st_size,
    }


def copy_file(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Copy ``src`` to ``dest`` (0600, fsync'd, renamed into place)."""
    Path(dest).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_file(dest) as out, open(src, "rb") as f:
        shutil.copyfileobj(f, out)


def verify(path: Path, sha256: str) -> None:
    """ValueError unless the file at ``path`` has this SHA-256."""
    try:
        got = sha256_file(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing from the backup") from None
    if got != sha256:
        raise ValueError(f"{path}: SHA-256 differs from the manifest; the backup is damaged")


def write_manifest(dest: Path, manifest: dict[str, Any]) -> None:
    """Write ``dest/manifest.json`` durably (last: it marks the backup complete)."""
    with atomic_file(dest / MANIFEST) as out:
        out.write(json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    fsync_dir(dest)


def read_manifest(source: Path, fmt: str) -> dict[str, Any]:
    """The manifest of the backup in ``source``; FileNotFoundError if it has none, ValueError if its
    format is not ``fmt``."""
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: no {MANIFEST}, so not a complete backup") from None
    if manifest.get("format") != fmt:
        raise ValueError(f"{source}: unknown backup format {manifest.get('format')!r} (expected {fmt})")
    return manifest


def read_backup(source: Path, fmt: str) -> tuple[dict[str, Any], Path]:
    """The manifest of the backup in ``source`` and the path of its database, verified."""
    manifest = read_manifest(source, fmt)
    db = source / manifest["database"]
    verify(db, manifest["database_sha256"])
    return manifest, db


def drop_sidecars(state_dir: Path, db_name: str) -> None:
    """Remove the ``-wal``/``-shm`` files of a database about to be replaced (they belong to the old one)."""
    for suffix in ("-wal", "-shm"):
        (state_dir / (db_name + suffix)).unlink(missing_ok=True)


def moved_to(db_path: Path, key_column: str) -> str | None:
    """The PostgreSQL store a service's SQLite database was copied to by its ``migrate`` command (the ``meta`` row
    ``moved_to``; ``key_column`` names ``meta``'s key column), None if it was not."""
    if not db_path.is_file():
        return None
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            return None
        row = db.execute(f"SELECT value FROM meta WHERE {key_column} = 'moved_to'").fetchone()
    finally:
        db.close()
    if row is None:
        return None
    return row[0].decode() if isinstance(row[0], bytes) else str(row[0])


def migrate_command(
    service: str, state_dir: Path, url: str, db_name: str, copy: Callable[[Path, str], Sequence[Any]], stays: str
) -> str:
    """``lac <service> migrate``: ``copy(state_dir, url)`` (returning ``lac.common.database.TableCopy``s) under the
    state directory's lock (the service stopped); returns what to print, and raises ``SystemExit`` with one line
    on any refusal. ``stays``: what stays in the state directory."""
    from lac.common.database import redact
    from lac.common.errors import LacError
    from lac.common.statelock import StateDirLock, StateDirLocked

    if not (state_dir / db_name).is_file():
        raise SystemExit(f"error: {state_dir} holds no {service} database ({db_name}); check --state-dir")
    try:
        with StateDirLock(state_dir, f"lac {service} migrate"):
            copied = copy(state_dir, url)
    except (StateDirLocked, LacError, OSError, ValueError, RuntimeError) as exc:
        raise SystemExit(f"error: {exc}") from None
    rows = ", ".join(f"{c.table} {c.rows}" for c in copied)
    return (
        f"copied the {service} database of {state_dir} into {redact(url)}, counts and checksums verified: {rows} "
        f"rows. Start the {service} with --store {redact(url)} and --state-dir {state_dir} ({stays} stay there); "
        f"{db_name} is kept as the copy's source, marked so that a {service} started on it refuses"
    )
