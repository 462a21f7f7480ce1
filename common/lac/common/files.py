"""Durable file writes: a reader sees the old file or the complete new one, never a torn one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import sqlite3

StrPath = str | os.PathLike[str]


@contextmanager
def atomic_file(path: StrPath, mode: int = 0o600) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it is fsync'd and renamed over ``path``, on error removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fsync_dir(path: StrPath) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path: StrPath) -> Path:
    """Create ``path`` (and parents) if needed and make it accessible to its owner only (0700)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def private_sqlite(path: StrPath) -> sqlite3.Connection:
    """A durable SQLite connection (WAL, ``synchronous=FULL``) on a database readable by its owner only.

    The file is created 0600 before SQLite opens it; SQLite gives the ``-wal`` and ``-shm`` files
    the database's permissions. The connection is in autocommit mode (explicit transactions).
    """
    import sqlite3

    path = Path(path)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            os.chmod(extra, 0o600)
    return db
