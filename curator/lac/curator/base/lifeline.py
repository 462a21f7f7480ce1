"""Worker processes that end when the curator ends, however it ends.

The curator's worker processes (ingest: they hold its private keys; releases) are started by
multiprocessing's forkserver, so their parent is the forkserver, not the curator, and nothing in
multiprocessing stops them when the curator is killed (SIGKILL, the OOM killer): the forkserver
and the resource tracker in turn wait for the workers, which hold their pipes open. A parent-death
signal (``PR_SET_PDEATHSIG``) or a watch on ``os.getppid()`` would follow the forkserver, not the
curator. ``die_with(owner)``, called by a worker's pool initializer, watches the curator itself: a
daemon thread waits on a pidfd of ``owner`` (Linux 5.3+; elsewhere it polls every 0.2 s) and ends
the worker at once when the owner ends. With the owner and its workers gone, the forkserver and
the resource tracker see their pipes close and exit by themselves.
"""

from __future__ import annotations

import os
import select
import threading
import time

__all__ = ["die_with"]

POLL_SECONDS = 0.2


def _wait_pidfd(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # readable once the process has ended
    while not poller.poll():
        pass


def _wait_polling(pid: int) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass  # alive, under another user
        time.sleep(POLL_SECONDS)


def die_with(owner: int) -> None:
    """End this process (``os._exit``) as soon as process ``owner`` ends; at once if it has."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here: poll
        wait = lambda: _wait_polling(owner)  # noqa: E731
    else:
        wait = lambda: _wait_pidfd(fd)  # noqa: E731

    def watch() -> None:
        wait()
        os._exit(1)

    threading.Thread(target=watch, name="lac-lifeline", daemon=True).start()
