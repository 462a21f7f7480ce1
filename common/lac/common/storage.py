"""Storage failures a service survives: which errors mean the disk (not the code) failed, free
space, and ``StorageGuard``, the state machine of a service whose storage fails and comes back.

A failed write (full disk, I/O error, free space below a floor) must never end a task silently
or leave a caller waiting: the first failure of an episode is logged once, turns gRPC health to
NOT_SERVING, and callers get UNAVAILABLE with ``retry-after-seconds`` at once; test writes with a
growing back-off then restore SERVING by themselves when space returns.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import suppress
from typing import Any, TypeVar

from lac.common.errors import Unavailable
from lac.common.retry import Backoff, jittered

__all__ = ["LowDiskSpace", "StorageFailed", "StorageGuard", "StoreThread", "storage_failure_reason", "free_bytes"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLite primary result codes that mean the storage (not the code) failed.
STORAGE_CODES = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PROTOCOL,
    sqlite3.SQLITE_NOTADB,
}
# PostgreSQL SQLSTATE classes and codes that mean the database server (not the code) failed: a lost or refused
# connection (08), insufficient resources such as a full disk (53), a server shutting down or starting (57P),
# its I/O (58), a read-only standby (25006).
POSTGRES_CLASSES = {"08", "53", "58"}
POSTGRES_CODES = {"57P01", "57P02", "57P03", "57P04", "57P05", "25006"}
PROBE_MIN_SECONDS, PROBE_MAX_SECONDS = 0.5, 10.0  # back-off of the test writes while the storage fails
STABLE_SECONDS = 60.0  # healthy this long after a recovery: the next failure starts the back-off anew
PROBES = Backoff(PROBE_MIN_SECONDS, PROBE_MAX_SECONDS)  # ceilings; each wait is jittered below its ceiling
SPACE_CHECK_SECONDS = 1.0  # how often free space is checked while healthy


class LowDiskSpace(Exception):
    """Free space on a state directory's filesystem is below the configured floor."""


class StorageFailed(Unavailable):
    """The service's storage cannot be written (full disk, I/O error, low space): retry later."""


def storage_failure_reason(exc: BaseException) -> str | None:
    """A short label (``SQLITE_FULL``, ``SQLITE_IOERR_WRITE``, ``ENOSPC``, ``LOW_DISK_SPACE``,
    ``POSTGRESQL_57P01``, ``POSTGRESQL_UNREACHABLE``) if ``exc`` is a failure of the storage, None if it is
    anything else (a bug)."""
    if isinstance(exc, LowDiskSpace):
        return "LOW_DISK_SPACE"
    if isinstance(exc, OSError):
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in STORAGE_CODES:
            return getattr(exc, "sqlite_errorname", None) or f"SQLITE_{code}"
    return _postgres_failure(exc)


def _postgres_failure(exc: BaseException) -> str | None:
    psycopg = sys.modules.get("psycopg")  # not imported: the error cannot be one of its
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    code = getattr(exc, "sqlstate", None)
    if code is None:  # no answer from a server: refused, reset, timed out, no connection in the pool
        return "POSTGRESQL_UNREACHABLE" if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) else None
    return f"POSTGRESQL_{code}" if code[:2] in POSTGRES_CLASSES or code in POSTGRES_CODES else None


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class StorageGuard:
    """Whether a service's storage works, and what happens when it stops.

    ``failed(op, reason, exc)`` notes a failure: the first one of an episode logs one line naming
    ``what`` failed, calls ``on_change(False)`` (e.g. health NOT_SERVING) and starts test writes
    (``probe``, an awaitable that raises while the storage still fails) with a growing back-off;
    the first that succeeds logs one line and calls ``on_change(True)``. ``check()`` raises
    ``StorageFailed`` (with ``retry_after``) while an episode lasts. ``check_space`` (optional,
    raising ``LowDiskSpace``) is run every ``SPACE_CHECK_SECONDS`` while healthy, so health follows
    free space without traffic. ``run`` calls a storage function on the service's storage thread and
    notes its failures; one that has no answer after ``stall_seconds`` (named by the setting
    ``stall_setting``) marks the storage STALLED while it goes on. ``advice`` ends the UNAVAILABLE
    message. Use from one event loop.
    """

    def __init__(
        self,
        what: str,
        consequence: str,
        probe: Callable[[], Awaitable[None]],
        on_change: Callable[[bool], None],
        check_space: Callable[[], Awaitable[None]] | None = None,
        advice: str = "nothing of this call was stored: retry later",
        stall_seconds: float | None = None,
        stall_setting: str = "stall_seconds",
    ):
        self.what, self.consequence, self.advice = what, consequence, advice
        self.stall_seconds, self.stall_setting = stall_seconds, stall_setting
        self._probe, self._on_change, self._check_space = probe, on_change, check_space
        self.error: str | None = None  # why the storage is unusable; None while it works
        self.failures: Counter[str] = Counter()  # failed storage operations by reason
        self.delay = PROBE_MIN_SECONDS
        self._failed_at = self._recovered_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._wake = asyncio.Event()
        self._ok = asyncio.Event()
        self._ok.set()

    @property
    def ok(self) -> bool:
        return self.error is None

    async def wait_ok(self) -> None:
        """Return once the storage works (at once if it does)."""
        await self._ok.wait()

    async def run(self, executor: Executor, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on ``executor`` (the storage thread); a storage failure is noted (``failed``)
        and raised as ``StorageFailed``; any other error propagates unchanged."""
        self.start()
        op = str(getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "storage"))
        call = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        try:
            if self.stall_seconds is not None:
                done, _ = await asyncio.wait({call}, timeout=self.stall_seconds)
                if not done:
                    self.stalled(op)
            return await call
        except asyncio.CancelledError:  # the caller gave up: drop the result (the call itself runs to its end)
            call.cancel()
            raise
        except Exception as exc:
            reason = storage_failure_reason(exc)
            if reason is None:
                raise
            raise self.failed(op, reason, exc) from None

    def stalled(self, op: str) -> None:
        """Note that ``op`` has had no answer from the storage for ``stall_seconds`` (once per episode)."""
        if self.error is None:
            self.failed(op, "STALLED", f"no answer from the disk within {self.stall_setting}={self.stall_seconds:g} s")

    def start(self) -> None:
        """Start watching (idempotent; needs a running event loop; never again after ``stop``)."""
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def unavailable(self) -> StorageFailed:
        return StorageFailed(
            f"{self.what} cannot be written ({self.error}); {self.advice}",
            retry_after=self.delay,
        )

    def check(self) -> None:
        """``StorageFailed`` while the storage fails."""
        if self.error is not None:
            raise self.unavailable()

    def failed(self, op: str, reason: str, exc: BaseException | str) -> StorageFailed:
        """Note a storage failure; returns the error to give the caller."""
        self.failures[reason] += 1
        if self.error is None:
            now = time.monotonic()
            # Failing again soon after a recovery: test less often, so a flapping disk cannot flood the log.
            self.delay = PROBE_MIN_SECONDS if now - self._recovered_at > STABLE_SECONDS else PROBES.grow(self.delay)
            self.error = f"{reason} in {op}: {exc}"
            self._failed_at = now
            self._ok.clear()
            self._on_change(False)
            log.error(
                "%s unusable (%s in %s: %s) until a test write succeeds: %s",
                self.what,
                reason,
                op,
                exc,
                self.consequence,
                extra={"storage": self.what, "failure_reason": reason, "operation": op},
            )
            self._wake.set()
            with suppress(RuntimeError):  # no running loop: started by the next call that has one
                self.start()
        return self.unavailable()

    async def _loop(self) -> None:
        while True:
            if self.error is None:
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), SPACE_CHECK_SECONDS)
                self._wake.clear()
                if self.error is None and self._check_space is not None:
                    try:
                        await self._check_space()
                    except Exception as exc:
                        self.failed("free space check", storage_failure_reason(exc) or type(exc).__name__, exc)
                continue
            await asyncio.sleep(jittered(self.delay))  # full jitter below the ceiling callers are told
            try:
                await self._probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not isinstance(exc, StorageFailed):  # a StorageFailed was counted by ``run`` already
                    self.failures[storage_failure_reason(exc) or type(exc).__name__] += 1
                self.delay = PROBES.grow(self.delay)
                continue
            now = time.monotonic()
            log.warning(
                "%s writable again after %.1f s (was: %s); serving",
                self.what,
                now - self._failed_at,
                self.error,
                extra={"storage": self.what, "failed_seconds": round(now - self._failed_at, 3)},
            )
            self.error, self._recovered_at = None, now
            self._ok.set()
            self._on_change(True)


class StoreThread:
    """The one thread a service's storage is used from, with the ``StorageGuard`` that watches it: ``run`` for
    the service's calls (a storage failure noted and raised as ``StorageFailed``), ``raw`` for the guard's own
    test writes, ``durably`` for background work that must happen once the storage is back."""

    def __init__(self, name: str, guard: StorageGuard):
        self.guard = guard
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def raw(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the storage thread, its errors unchanged."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the storage thread; a storage failure is noted (one log line, health NOT_SERVING, test
        writes until it works again) and raised as ``StorageFailed`` (UNAVAILABLE with retry-after)."""
        return await self.guard.run(self._executor, fn, *args)

    async def durably(self, fn: Callable[..., T], *args: Any) -> T:
        """``run``, tried again after each recovery of the storage until it succeeds."""
        while True:
            try:
                return await self.run(fn, *args)
            except StorageFailed:
                await self.guard.wait_ok()

    def shutdown(self) -> None:
        self._executor.shutdown()
