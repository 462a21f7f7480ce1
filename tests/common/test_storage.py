"""StorageGuard: the storage-failure state machine both services use (lac.common.storage)."""

from __future__ import annotations

import asyncio
import errno
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from lac.common.storage import StorageFailed, StorageGuard, storage_failure_reason


def test_a_failure_is_noted_once_probed_and_recovered():
    async def scenario():
        changes: list[bool] = []
        disk_full = True
        probes = 0
        pool = ThreadPoolExecutor(max_workers=1)

        def write() -> str:
            if disk_full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return "written"

        async def probe() -> None:
            nonlocal probes
            probes += 1
            await guard.run(pool, write)  # a failed test write through ``run`` is counted once, not twice

        guard = StorageGuard("test store", "callers wait", probe=probe, on_change=changes.append, advice="try later")
        assert await guard.run(pool, lambda: 7) == 7
        with pytest.raises(ValueError):  # a bug is not a storage failure: no state change
            await guard.run(pool, int, "x")
        assert guard.ok and changes == []

        for _ in range(2):
            with pytest.raises(StorageFailed) as err:
                await guard.run(pool, write)
        assert "ENOSPC in write" in str(err.value) and str(err.value).endswith("try later")
        assert err.value.retry_after and err.value.retry_after > 0
        assert changes == [False] and not guard.ok and guard.failures == {"ENOSPC": 2}
        with pytest.raises(StorageFailed):
            guard.check()
        waiting = asyncio.ensure_future(guard.wait_ok())
        while probes == 0:
            await asyncio.sleep(0.05)
        assert not waiting.done()
        disk_full = False
        await asyncio.wait_for(waiting, 30)
        assert changes == [False, True] and guard.ok and guard.error is None
        assert guard.failures == {"ENOSPC": 2 + probes - 1}
        guard.check()
        await guard.stop()
        pool.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (OSError(errno.EIO, "I/O error"), "EIO"),
        (ValueError("a bug"), None),
        (KeyError("a bug"), None),
    ],
)
def test_failure_reasons(exc, reason):
    assert storage_failure_reason(exc) == reason


def test_postgresql_server_failures_are_storage_failures_and_bugs_are_not():
    """What a PostgreSQL store raises when its server is gone, full, shutting down or a read-only standby is a
    storage failure (UNAVAILABLE, NOT_SERVING); a constraint or syntax error is a bug."""
    psycopg = pytest.importorskip("psycopg")  # the services' postgresql extra
    from lac_testkit import free_port

    with pytest.raises(psycopg.OperationalError) as refused:  # nothing listens there
        psycopg.connect(f"postgresql://lac@127.0.0.1:{free_port()}/x", connect_timeout=5)
    assert storage_failure_reason(refused.value) == "POSTGRESQL_UNREACHABLE"
    e = psycopg.errors
    assert storage_failure_reason(e.DiskFull()) == "POSTGRESQL_53100"
    assert storage_failure_reason(e.AdminShutdown()) == "POSTGRESQL_57P01"
    assert storage_failure_reason(e.CannotConnectNow()) == "POSTGRESQL_57P03"
    assert storage_failure_reason(e.ReadOnlySqlTransaction()) == "POSTGRESQL_25006"
    assert storage_failure_reason(e.ConnectionFailure()) == "POSTGRESQL_08006"
    for bug in (e.UniqueViolation(), e.UndefinedTable(), e.SyntaxError(), e.SerializationFailure()):
        assert storage_failure_reason(bug) is None, bug
