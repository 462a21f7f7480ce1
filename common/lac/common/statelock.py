"""One writer per state directory: a server (or a restore) holds an exclusive lock on ``DIR/lac.lock``.

The lock is ``flock`` on an open file (close-on-exec, so worker processes started later do not
inherit it): the kernel drops it when the holder's process ends, however it ends (SIGKILL
included), so a lock file left behind never blocks a restart. The file names the holder's pid and
role, for the message of whoever is refused. Backups only read a live directory and take no lock.
"""

from __future__ import annotations

import fcntl
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lac.common.files import StrPath, private_dir

__all__ = ["LOCK_NAME", "StateDirLocked", "StateDirLock", "waiting_lock"]

LOCK_NAME = "lac.lock"


class StateDirLocked(OSError):
    """Another process holds the state directory's lock."""


class StateDirLock:
    """The exclusive lock of ``state_dir`` (created 0700 if missing), taken at once or
    ``StateDirLocked`` naming the holder; held until ``release()``, the object's collection or
    the end of the process. A context manager too."""

    def __init__(self, state_dir: StrPath, holder: str):
        self.path = private_dir(state_dir) / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirLocked(
                f"{Path(state_dir)} is in use by {_holder(self.path)}: one server (or restore) per state "
                f"directory; stop that one first, or give this one its own state directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
        self._close = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        """Drop the lock (again: nothing)."""
        self._close()

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(path: Path) -> str:
    """``<role> (pid N)`` as the lock file names its holder."""
    try:
        pid, _, role = path.read_text().strip().partition(" ")
    except OSError:
        pid, role = "", ""
    if not pid.isdigit():  # the holder has just taken the lock and not yet written its name
        return "another process (pid not known yet)"
    return f"{role or 'another process'} (pid {pid})"


@contextmanager
def waiting_lock(path: StrPath, stop: Callable[[], bool] = lambda: False, poll: float = 0.5) -> Iterator[bool]:
    """Hold the exclusive ``flock`` of the file ``path`` (created 0600) for the ``with`` block, waiting while another
    process holds it (checked every ``poll`` s; ``InterruptedError`` once ``stop()`` is true). Yields whether it had
    to wait. On NFSv4 Linux clients ``flock`` is a whole-file lock the server holds, released when the holder's
    process ends, however it ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stop():
                    raise InterruptedError(f"stopped while waiting for the lock {path}") from None
                waited = True
                time.sleep(poll)
        yield waited
    finally:
        os.close(fd)  # drops the lock
