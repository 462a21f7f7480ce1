"""The release lease: of the shuffler replicas over one report log, exactly one at a time releases batches, forwards
them to the curator and runs the housekeeping (pruning quota rows, rotating the idempotency ids); every replica
accepts Submit.

* **PostgreSQL** (``PostgresLease``): a session-level advisory lock, ``pg_try_advisory_lock`` on a key derived from
  the log's schema name and the database schema it lives in, taken on a dedicated connection outside the pool (a
  pooled connection would hand the session, and the lock with it, to other work). The holder checks every
  ``CHECK_SECONDS`` that its session still holds the lock (``pg_locks``); a check that fails, or does not answer
  within ``CHECK_TIMEOUT_SECONDS``, is the lease lost at once. Replicas without it try to take it every
  ``CHECK_SECONDS``. The lock lives as long as the holder's session, so it passes when that session ends:

  - a holder that exits or is killed (SIGKILL, OOM): its kernel closes the TCP connection, the server sees the
    end of the stream and ends the session at once;
  - a holder whose machine dies or is cut off sends nothing more: its session sets ``idle_session_timeout`` to
    ``IDLE_SESSION_SECONDS``, which the server enforces (PostgreSQL ≥ 14) since the checks keep a live holder's
    session busy every second; TCP keepalives on the connection (``KEEPALIVES``, and ``tcp_user_timeout``) make
    the holder's own side fail within a few seconds too, and the server's ``tcp_keepalives_*`` settings find a dead
    peer of a session that is not idle.

  So a dead holder's lease passes within ``IDLE_SESSION_SECONDS`` plus a check (a killed one's within a check).
* **SQLite** (``FileLease``): one process serves a state directory (``StateDirLock``), so it always holds the
  lease; it is an ``flock`` on ``shuffler.lease`` in the state directory, so that two report logs opened on one
  file within a process (the tests' replicas) hold it one at a time as well.

The lease keeps the work single; it is not what keeps the state right. Two replicas that both believe they hold
it (one that lost it and has not noticed yet) cannot both take a report: a release is one serializable
transaction, and the rows it takes are held by its batch for every other. A batch delivered by both reaches the
curator twice under one batch id, which it stores once.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from lac.common.database import Database

__all__ = ["Lease", "FileLease", "PostgresLease", "open_lease", "CHECK_SECONDS", "CHECK_TIMEOUT_SECONDS"]

log = logging.getLogger(__name__)

CHECK_SECONDS = 1.0  # the holder checks its lease, and the others try to take it, this often
CHECK_TIMEOUT_SECONDS = 5.0  # a check not answered within this long is the lease lost
IDLE_SESSION_SECONDS = 10  # the lease session's idle_session_timeout: a silent holder's lock passes after this
KEEPALIVES = {  # libpq's TCP settings of the lease connection: a cut-off server is noticed within seconds
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": int(CHECK_TIMEOUT_SECONDS * 1000),
    "connect_timeout": 2,
}


class Lease(ABC):
    """Who releases batches (see the module doc). Its methods block: call them off the event loop."""

    held = False

    @abstractmethod
    def acquire(self) -> bool:
        """Try to take the lease, without waiting; whether this replica holds it now."""

    @abstractmethod
    def check(self) -> bool:
        """Whether this replica still holds the lease (False after a loss: ``acquire`` may take it again)."""

    @abstractmethod
    def release(self) -> None:
        """Give the lease up: at a graceful stop (the next replica takes it within ``CHECK_SECONDS``), or after a
        check that did not answer (its session is closed rather than trusted again). Any thread."""


def lease_key(name: str, schema: str) -> tuple[int, int]:
    """The advisory lock's two 32-bit keys, from the log's schema ``name`` and the database ``schema`` it is in."""
    digest = hashlib.sha256(f"lac-release-lease:{name}:{schema}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True), int.from_bytes(digest[4:8], "big", signed=True)


class FileLease(Lease):
    """SQLite: an ``flock`` on ``path``, held while the file stays open."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._fd, self.held = fd, True
        return True

    def check(self) -> bool:
        return self.held

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # ends the flock
        self._fd, self.held = None, False


class PostgresLease(Lease):
    """PostgreSQL: a session-level advisory lock on a connection of its own to ``conninfo`` (see the module doc)."""

    def __init__(self, conninfo: str, name: str):
        self.conninfo = conninfo
        self.name = name
        self._conn: Any = None
        self._key: tuple[int, int] | None = None

    def acquire(self) -> bool:
        if self.held:
            return self.check()
        import psycopg

        try:
            if self._conn is None:
                conninfo = psycopg.conninfo.make_conninfo(self.conninfo, **KEEPALIVES)
                self._conn = psycopg.connect(conninfo, autocommit=True)
                self._conn.execute(f"SET idle_session_timeout = '{IDLE_SESSION_SECONDS}s'")
                self._conn.execute(f"SET statement_timeout = '{CHECK_TIMEOUT_SECONDS:g}s'")
                (schema,) = self._conn.execute("SELECT current_schema()").fetchone()
                self._key = lease_key(self.name, schema)
            (taken,) = self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", self._key).fetchone()
        except psycopg.Error as exc:
            log.debug("could not try the release lease: %s", exc)
            self._drop()
            return False
        self.held = bool(taken)
        return self.held

    def check(self) -> bool:
        if not self.held:
            return False
        import psycopg

        assert self._key is not None
        try:
            (n,) = self._conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted "
                "AND objsubid = 2 AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
                [k & 0xFFFFFFFF for k in self._key],  # pg_locks shows the two keys as unsigned oids
            ).fetchone()
        except psycopg.Error as exc:
            log.debug("release lease check failed: %s", exc)
            n = 0
        if not n:
            self._drop()
        return bool(n)

    def release(self) -> None:
        self._drop()

    def _drop(self) -> None:
        conn, self._conn, self.held = self._conn, None, False
        if conn is not None:
            try:
                conn.close()  # the session ends, and its advisory lock with it
            except Exception as exc:  # a connection already broken
                log.debug("closing the lease connection: %s", exc)


def open_lease(db: Database, state_dir: Path, name: str) -> Lease:
    """The lease of the report log over ``db`` (``name``: its schema's name)."""
    if db.dialect == "postgresql":
        return PostgresLease(db.pool.conninfo, name)  # type: ignore[attr-defined]
    return FileLease(state_dir / f"{name}.lease")
