"""Online backup and restore of a shuffler's state: the report log and the tokens file.

``backup`` copies the live report log with SQLite's online backup API through a read-only
connection: one read transaction, so the copy is one consistent snapshot (every commit before
it, none after) while the server keeps writing (WAL readers do not block the writer). The copy
is a self-contained database (rollback journal, no ``-wal``), checked with ``quick_check``;
``manifest.json`` is written last and names its SHA-256, so a backup without a manifest is
incomplete. The tokens file is copied beside it.

``restore`` verifies the manifest and the copy and installs both into a state directory whose
shuffler is stopped. What a restored shuffler does not know: reports acknowledged after the
backup (they are lost unless clients resend them), idempotency ids and quota use recorded
after it (a resent report is stored again; the curator drops reports it has seen by the id
inside the seal), and batches delivered after it (they are sent again under the same batch id,
which the curator de-duplicates).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

from lac.common.files import atomic_file, fsync_dir, private_dir

DB_NAME = "shuffler.sqlite"
TOKENS_NAME = "clients.tokens"
MANIFEST = "manifest.json"
FORMAT = "lac-shuffler-backup/1"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(db_path: Path) -> dict:
    """What a report log holds: buffered reports, undelivered batches, counters."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {"buffered_reports": db.execute("SELECT COUNT(*) FROM buffer").fetchone()[0],
                "batches_pending": db.execute("SELECT COUNT(*) FROM batches WHERE delivered = 0").fetchone()[0],
                "counters": dict(db.execute("SELECT name, value FROM counters ORDER BY name"))}
    finally:
        db.close()


def backup(state_dir: Path, dest: Path, tokens_file: Path | None = None) -> dict:
    """Copy the report log of ``state_dir`` (live or stopped) and its tokens file into ``dest``
    (created 0700, must not hold a backup already). Returns the manifest."""
    source = state_dir / DB_NAME
    if not source.exists():
        raise FileNotFoundError(f"{source}: no report log to back up")
    if (dest / MANIFEST).exists() or (dest / DB_NAME).exists():
        raise FileExistsError(f"{dest} already holds a backup; choose a new directory")
    private_dir(dest)
    partial = dest / (DB_NAME + ".partial")
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_RDWR | os.O_CREAT, 0o600))
    # Read-only: the backup never writes to (or checkpoints) the live database.
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
    os.replace(partial, dest / DB_NAME)
    manifest = {"format": FORMAT, "created_unix": started, "source": str(source.resolve()),
                "database": DB_NAME, "database_sha256": _sha256(dest / DB_NAME),
                "database_bytes": (dest / DB_NAME).stat().st_size, **describe(dest / DB_NAME), "tokens": None}
    tokens = tokens_file if tokens_file is not None else state_dir / TOKENS_NAME
    if tokens.exists():
        with atomic_file(dest / TOKENS_NAME) as out, open(tokens, "rb") as src_tokens:
            shutil.copyfileobj(src_tokens, out)
        manifest["tokens"] = {"file": TOKENS_NAME, "sha256": _sha256(dest / TOKENS_NAME)}
    with atomic_file(dest / MANIFEST) as out:
        out.write(json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    fsync_dir(dest)
    return manifest


def restore(source: Path, state_dir: Path, tokens_file: Path | None = None, force: bool = False) -> dict:
    """Install the backup in ``source`` as the state of ``state_dir`` (its shuffler must be stopped).

    Refuses a state directory that already holds a report log (or tokens file) unless ``force``.
    Returns the backup's manifest.
    """
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: no {MANIFEST}, so not a complete backup") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{source}: unknown backup format {manifest.get('format')!r}")
    db = source / manifest["database"]
    if _sha256(db) != manifest["database_sha256"]:
        raise ValueError(f"{db}: SHA-256 differs from the manifest; the backup is damaged")
    tokens_copy = manifest.get("tokens")
    if tokens_copy and _sha256(source / tokens_copy["file"]) != tokens_copy["sha256"]:
        raise ValueError(f"{source / tokens_copy['file']}: SHA-256 differs from the manifest")
    target = state_dir / DB_NAME
    tokens_target = tokens_file if tokens_file is not None else state_dir / TOKENS_NAME
    existing = [p for p in (target, tokens_target if tokens_copy else None) if p is not None and p.exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(map(str, existing))} exists; stop that shuffler and pass --force to "
                              f"replace its state with the backup")
    private_dir(state_dir)
    for suffix in ("-wal", "-shm"):  # of a replaced log: they belong to the old database
        (state_dir / (DB_NAME + suffix)).unlink(missing_ok=True)
    with atomic_file(target) as out, open(db, "rb") as src:
        shutil.copyfileobj(src, out)
    if tokens_copy:
        private_dir(tokens_target.parent)
        with atomic_file(tokens_target) as out, open(source / tokens_copy["file"], "rb") as src:
            shutil.copyfileobj(src, out)
    fsync_dir(state_dir)
    return manifest
