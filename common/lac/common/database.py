"""The SQL database under a service's durable state: embedded SQLite (one machine, the default) or PostgreSQL
(replicas of a service share one database). A service's store (the curator's ``CuratorStore``, the shuffler's
``ReportLog``) is written once over ``Database``; the two implementations differ in how they connect, run a
transaction and migrate, not in what the store does.

* Statements are written once, in the SQL both databases speak, with ``?`` placeholders (``PostgresDatabase``
  translates them). Tables that a store reads in arrival order have a ``rowid`` column on PostgreSQL (SQLite's is
  implicit), so ``ORDER BY rowid`` reads the same on both.
* ``transaction(fn)`` runs ``fn()`` in one serializable transaction: SQLite's ``BEGIN IMMEDIATE`` (one writer at a
  time), PostgreSQL's ``SERIALIZABLE`` isolation, where a transaction that conflicted with a concurrent one (a
  replica's) is rolled back and ``fn`` runs again, so a read-then-write (budget left ≥ charge, then the charge) is
  atomic across replicas. ``fn`` must be safe to run again: its writes to files go to the same names.
* ``migrate(name, steps)`` brings the schema to the newest numbered step, recording each in ``schema_version``,
  under a lock (SQLite's write lock, a PostgreSQL advisory lock), so two replicas starting together apply each
  step once. A database newer than the code is refused.

PostgreSQL needs ``psycopg`` 3 with ``psycopg_pool`` (the ``postgresql`` extra); a pool keeps its connections,
replacing those a restarted server broke. Its connection and disk errors are storage failures
(``lac.common.storage.storage_failure_reason``): UNAVAILABLE with retry-after, health NOT_SERVING until a test
write succeeds.
"""

from __future__ import annotations

import hashlib
import logging
import random
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from lac.common.errors import DataLoss, FailedPrecondition, Unavailable

__all__ = [
    "Database",
    "SqliteDatabase",
    "PostgresDatabase",
    "Migration",
    "Rows",
    "TableCopy",
    "copy_tables",
    "copy_into_postgres",
    "bump_counters",
    "open_database",
    "is_postgres_url",
    "redact",
    "POSTGRESQL_EXTRA",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

POSTGRESQL_EXTRA = "psycopg[binary,pool]"  # what the services' `postgresql` extras install
CONNECT_SECONDS = 5.0  # a PostgreSQL connection not had within this long is a storage failure
DOWN_WAIT_SECONDS = 0.5  # the wait for a pooled connection while the last one could not be had
RETRIES = 20  # serializable transactions retried after a conflict with a concurrent one, at most this often
RETRY_SECONDS = 0.002, 0.2  # back-off between those retries (jittered below a ceiling that doubles)


class Rows(Protocol):
    """What a statement returns (a DB-API cursor's reading side)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


@dataclass(frozen=True)
class Migration:
    """One numbered step of a schema: ``apply(db)`` runs in the migration's transaction."""

    version: int
    what: str
    apply: Callable[[Database], object]


def is_postgres_url(store: str) -> bool:
    """Whether a ``store`` setting names a PostgreSQL database (``postgresql://…`` or ``postgres://…``)."""
    return store.split("://", 1)[0] in ("postgresql", "postgres")


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


class Database(ABC):
    """A connection to a service's SQL database (see the module doc). Statements run on the calling thread; a
    transaction belongs to the thread that opened it."""

    dialect: ClassVar[str]
    where: str  # the database, for messages (a path, or a URL without its password)
    Error: tuple[type[Exception], ...]  # what its driver raises

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def in_transaction(self) -> bool:
        return getattr(self._local, "conn", None) is not None

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """Run one statement (in this thread's transaction, if one is open)."""

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for each of ``rows``."""

    @abstractmethod
    def transaction(self, fn: Callable[[], T]) -> T:
        """``fn()`` in one serializable transaction, committed when it returns, rolled back when it raises (see
        the module doc); within a transaction already open on this thread, just ``fn()``."""

    @abstractmethod
    def migrate(self, name: str, steps: Sequence[Migration]) -> int:
        """Apply the ``steps`` newer than the database's ``schema_version`` under a lock named ``name``; returns
        the version reached."""

    @abstractmethod
    def close(self) -> None: ...

    def stream(self, sql: str) -> Iterator[Any]:
        """The rows of a query, read as they are iterated (for tables of any size)."""
        return iter(self.execute(sql))

    def load(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Insert ``rows`` (values of ``columns``) into ``table``, within a transaction."""
        marks = ", ".join("?" * len(columns))
        self.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def after_load(self, table: str) -> None:
        """After rows with their own ids were loaded into ``table``: new rows get ids past them (SQLite's rowids
        do by themselves)."""
        return None

    def script(self, sql: str) -> None:
        """Run each ``;``-separated statement of ``sql`` (schema text: no ``;`` inside a statement)."""
        for statement in sql.split(";"):
            if statement.strip():
                self.execute(statement)

    def columns(self, table: str) -> list[str]:
        """The columns of ``table``, in order ([] if there is no such table)."""
        return [str(r[0]) for r in self.execute(*self._columns_query(table))]

    def tables(self) -> list[str]:
        """Every table, by name."""
        query = (
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            if self.dialect == "sqlite"
            else "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
        )
        return [str(r[0]) for r in self.execute(query)]

    @abstractmethod
    def _columns_query(self, table: str) -> tuple[str, tuple[Any, ...]]: ...

    def _apply(self, name: str, steps: Sequence[Migration]) -> int:
        """Within the migration's transaction and lock: the pending steps, each recorded."""
        self.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, what TEXT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL)"
        )
        (current,) = self.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        newest = max((s.version for s in steps), default=0)
        if current > newest:
            raise FailedPrecondition(
                f"{self.where} holds the {name} schema version {current}, newer than this program's ({newest}): "
                f"run the version of LAC that wrote it, or a newer one"
            )
        for step in sorted(steps, key=lambda s: s.version):
            if step.version > current:
                step.apply(self)
                self.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (step.version, step.what, time.time()))
                log.info("%s: %s schema version %d applied (%s)", self.where, name, step.version, step.what)
        return int(max(current, newest))


def open_database(sqlite_path: Path, store: str = "") -> Database:
    """A service's database: the SQLite file ``sqlite_path`` for an empty ``store`` setting, else the PostgreSQL
    database its ``postgresql://`` URL names."""
    if not store:
        return SqliteDatabase(sqlite_path)
    if not is_postgres_url(store):
        raise ValueError(f"store must be empty (SQLite in the state directory) or a postgresql:// URL, not {store!r}")
    return PostgresDatabase(store)


def bump_counters(db: Database, bumps: Mapping[str, int]) -> None:
    """Add ``bumps`` to the service's ``counters`` table (name, value), within a transaction."""
    db.executemany(
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
        ((k, v) for k, v in bumps.items() if v),
    )


class SqliteDatabase(Database):
    """A SQLite file in WAL mode with ``synchronous=FULL`` (``lac.common.files.private_sqlite``): one connection,
    used by one thread at a time."""

    dialect = "sqlite"

    def __init__(self, path: Path):
        import sqlite3

        from lac.common.files import private_sqlite

        super().__init__()
        self.where = str(path)
        self.path = Path(path)
        self.conn: sqlite3.Connection = private_sqlite(path)
        self.Error = (sqlite3.Error,)

    @classmethod
    def wrap(cls, conn: Any, where: str) -> SqliteDatabase:
        """Around an open ``sqlite3`` connection in autocommit mode (a backup's, a read-only one)."""
        import sqlite3

        db = cls.__new__(cls)
        Database.__init__(db)
        db.where, db.path, db.conn, db.Error = where, Path(where), conn, (sqlite3.Error,)
        return db

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def transaction(self, fn: Callable[[], T]) -> T:
        if self.in_transaction:
            return fn()
        if self.conn.in_transaction:  # left open by a failure the connection could not roll back then
            self.conn.execute("ROLLBACK")
        self.conn.execute("BEGIN IMMEDIATE")
        self._local.conn = self.conn
        try:
            result = fn()
            self.conn.execute("COMMIT")
            return result
        except BaseException:
            self._rollback()
            raise
        finally:
            self._local.conn = None

    def _rollback(self) -> None:
        """Roll back the open transaction, if any; a failing rollback (the disk again) is left to the next
        transaction rather than hiding the error being handled."""
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except self.Error:
            pass

    def migrate(self, name: str, steps: Sequence[Migration]) -> int:
        return self.transaction(lambda: self._apply(name, steps))  # BEGIN IMMEDIATE: the write lock

    def _columns_query(self, table: str) -> tuple[str, tuple[Any, ...]]:
        return "SELECT name FROM pragma_table_info(?)", (table,)

    def close(self) -> None:
        self.conn.close()


class PostgresDatabase(Database):
    """A PostgreSQL database at ``url`` (``postgresql://user@host:port/dbname``; a password from ``PGPASSWORD``
    or ``~/.pgpass`` rather than the URL), through a pool of connections. Opening fails at once
    (``Unavailable``) when the server cannot be reached within ``CONNECT_SECONDS``."""

    dialect = "postgresql"

    def __init__(self, url: str, max_connections: int = 4):
        super().__init__()
        self.where = redact(url)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError as exc:
            raise FailedPrecondition(
                f"a PostgreSQL store needs psycopg 3 and psycopg_pool ({exc.name} does not import): install the "
                f"service's postgresql extra, e.g. pip install 'lac-curator[postgresql]' (or '{POSTGRESQL_EXTRA}')"
            ) from None
        self.Error = (psycopg.Error,)
        self._pool_timeout = PoolTimeout
        self._down = False
        self._retryable = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)

        def configure(conn: Any) -> None:
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE

        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # its retries; the StorageGuard logs the failure
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, "connect_timeout": max(2, round(CONNECT_SECONDS))},
            configure=configure,
            check=ConnectionPool.check_connection,  # a connection the server dropped (a restart) is replaced
            timeout=CONNECT_SECONDS,
            # The pool's own reconnection backs off without bound for this long: giving up soon lets the next call
            # start a fresh attempt at once, so a server back after a long outage is used within a call or two.
            reconnect_timeout=2 * CONNECT_SECONDS,
            name="lac",
            open=False,
        )
        try:
            self.pool.open(wait=True, timeout=CONNECT_SECONDS)
        except Exception as exc:
            self.pool.close()
            raise Unavailable(
                f"cannot connect to the PostgreSQL store {self.where} within {CONNECT_SECONDS:g} s: {exc}",
                retry_after=CONNECT_SECONDS,
            ) from None

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """A connection from the pool. While the server is unreachable (the last wait failed), a call waits
        ``DOWN_WAIT_SECONDS`` rather than ``CONNECT_SECONDS``, so the storage thread's calls fail one after another
        at once instead of queueing behind each other's waits; the pool keeps reconnecting meanwhile, and the
        first connection it has ends that."""
        timeout = DOWN_WAIT_SECONDS if self._down else CONNECT_SECONDS
        try:
            conn = self.pool.getconn(timeout=timeout)
        except self._pool_timeout:
            self._down = True
            raise
        self._down = False
        try:
            yield conn
        finally:
            self.pool.putconn(conn)

    @staticmethod
    @cache
    def _sql(sql: str) -> str:
        """``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled)."""
        return sql.replace("%", "%%").replace("?", "%s")

    def _run(self, fn: Callable[[Any], T]) -> T:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return fn(conn)
        with self._connection() as conn:  # autocommit: the statement is its own transaction
            return fn(conn)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        def run(conn: Any) -> Rows:
            cur = conn.execute(self._sql(sql), tuple(params))
            return _Fetched(cur.fetchall() if cur.description is not None else [])

        return self._run(run)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        def run(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.executemany(self._sql(sql), [tuple(r) for r in rows])

        self._run(run)

    def transaction(self, fn: Callable[[], T]) -> T:
        if self.in_transaction:
            return fn()
        ceiling = RETRY_SECONDS[0]
        for attempt in range(RETRIES + 1):
            try:
                with self._connection() as conn:
                    self._local.conn = conn
                    try:
                        with conn.transaction():
                            return fn()
                    finally:
                        self._local.conn = None
            except self._retryable as exc:
                if attempt == RETRIES:
                    raise Unavailable(
                        f"the PostgreSQL store {self.where} kept refusing this transaction for conflicts with "
                        f"concurrent ones ({type(exc).__name__}); retry",
                        retry_after=1.0,
                    ) from exc
                time.sleep(random.uniform(0, ceiling))
                ceiling = min(2 * ceiling, RETRY_SECONDS[1])
        raise AssertionError("unreachable")

    def migrate(self, name: str, steps: Sequence[Migration]) -> int:
        key = int.from_bytes(hashlib.sha256(f"lac-schema:{name}".encode()).digest()[:8], "big", signed=True)
        with self._connection() as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))  # held by this session until unlocked
            try:
                self._local.conn = conn
                with conn.transaction():  # its snapshot is taken after the lock: it sees what the holder applied
                    return self._apply(name, steps)
            finally:
                self._local.conn = None
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def stream(self, sql: str) -> Iterator[Any]:
        conn = self._local.conn  # a server-side cursor lives in a transaction
        with conn.cursor(name="lac_stream") as cur:
            cur.itersize = 10_000
            cur.execute(self._sql(sql), ())
            yield from cur

    def load(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        with self._local.conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def after_load(self, table: str) -> None:
        for (column,) in self.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? AND is_identity = 'YES'",
            (table,),
        ):
            self.execute(
                f"SELECT setval(pg_get_serial_sequence(?, ?), COALESCE(MAX({column}), 0) + 1, false) FROM {table}",
                (table, column),
            )

    def _columns_query(self, table: str) -> tuple[str, tuple[Any, ...]]:
        return (
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )

    def close(self) -> None:
        self.pool.close()


class _Fetched(list[Any]):
    """A PostgreSQL statement's rows, fetched before its connection went back to the pool."""

    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


@dataclass(frozen=True)
class TableCopy:
    """What ``copy_tables`` copied of one table: its rows and their checksum, equal on both sides."""

    table: str
    rows: int
    checksum: str


def _checksum(rows: Iterable[Sequence[Any]]) -> tuple[int, str]:
    """(rows, a checksum of their values that does not depend on their order): the sum of each row's SHA-256,
    over values as Python reads them from either database (an int, a float's exact bits, text, bytes, NULL)."""
    n, total = 0, 0
    for row in rows:
        h = hashlib.sha256()
        for v in row:
            if v is None:
                h.update(b"N")
            elif isinstance(v, bool | int):
                h.update(b"i" + str(int(v)).encode())
            elif isinstance(v, float):
                h.update(b"f" + struct.pack("<d", v))
            elif isinstance(v, str):
                h.update(b"s" + struct.pack("<Q", len(v.encode())) + v.encode())
            else:
                b = bytes(v)
                h.update(b"b" + struct.pack("<Q", len(b)) + b)
        total = (total + int.from_bytes(h.digest(), "big")) % (1 << 256)
        n += 1
    return n, f"{total:064x}"


def copy_tables(source: Database, target: Database, tables: Sequence[str]) -> list[TableCopy]:
    """Copy every row of ``tables`` from ``source`` into ``target`` (both at the same schema version; ``target``
    empty, else ``FailedPrecondition``) in one transaction of ``target``, which commits only if each table's row
    count and checksum read back from ``target`` equal ``source``'s (else ``DataLoss``, nothing copied). Ids are
    copied as they are (``rowid`` too, where ``target`` has that column), so orders and references stay."""
    versions = [int(db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]) for db in
                (source, target)]  # fmt: skip
    if versions[0] != versions[1]:
        raise FailedPrecondition(
            f"{source.where} is at schema version {versions[0]} and {target.where} at {versions[1]}: open both "
            f"with the same version of LAC"
        )
    plans = []
    for table in tables:
        have, want = source.columns(table), target.columns(table)
        extra = [c for c in want if c not in have]
        if sorted(c for c in have if c not in want) or extra not in ([], ["rowid"]):
            raise FailedPrecondition(f"table {table} has columns {have} in {source.where} but {want} in {target.where}")
        plans.append((table, have + extra))

    def copy() -> list[TableCopy]:
        full = [(t, n) for t, _ in plans if (n := int(target.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]))]
        if full:
            raise FailedPrecondition(
                f"{target.where} is not empty ({', '.join(f'{t}: {n} rows' for t, n in full)}): copy only into a "
                f"database that holds no state yet"
            )
        done = []
        for table, columns in plans:
            names = ", ".join(columns)
            target.load(table, columns, source.stream(f"SELECT {names} FROM {table}"))
            target.after_load(table)
            want = _checksum(source.stream(f"SELECT {names} FROM {table}"))
            got = _checksum(target.stream(f"SELECT {names} FROM {table}"))
            if got != want:
                raise DataLoss(
                    f"table {table} read back from {target.where} holds {got[0]} rows (checksum {got[1][:12]}) "
                    f"where {source.where} holds {want[0]} ({want[1][:12]}): nothing was copied"
                )
            done.append(TableCopy(table, *want))
        return done

    return target.transaction(copy)


def copied_elsewhere(where: str, url: str, service: str, holds: str) -> str:
    """Why a service refuses the SQLite database ``where`` that `lac SERVICE migrate` copied to ``url``: its state
    (``holds``) is there now."""
    return (
        f"{where} was copied to the PostgreSQL store {url} by `lac {service} migrate`, and the {holds} is there now: "
        f"start the {service} with --store {url} (the password from PGPASSWORD or ~/.pgpass); this SQLite database is "
        "kept only as the copy's source"
    )


def copy_into_postgres(
    source: Database, url: str, name: str, steps: Callable[[Database], Sequence[Migration]], tables: Sequence[str]
) -> list[TableCopy]:
    """A service's ``migrate`` command: bring the empty PostgreSQL database ``url`` to the schema ``name``
    (``steps`` of its dialect) and copy ``tables`` from ``source`` into it (``copy_tables``)."""
    if not is_postgres_url(url):
        raise ValueError(f"--to must be a postgresql:// URL, not {redact(url)!r}")
    target = PostgresDatabase(url)
    try:
        target.migrate(name, steps(target))
        return copy_tables(source, target, tables)
    finally:
        target.close()
