"""Worker processes that cannot wedge the curator: ``WorkerPool``.

A pool of ``concurrent.futures.ProcessPoolExecutor`` shares one result queue, with a lock, between
its workers: a worker killed (by the OOM killer, say) while it holds that lock blocks every other
worker's result forever, and the executor never notices (issue 37). Here every worker has its own
pipe to the server and nothing is shared between workers, so a worker that dies at any instant,
even in the middle of a message, holds up no one else:

* an item (a chunk of a batch) is sent to one idle worker, and its result read from that worker's
  pipe by a thread of the server that serves that worker alone (its *lane*);
* a worker's end is seen through its process sentinel and a pidfd (Linux 5.3+), whatever its pipe
  holds: the jobs in the pool fail at once with ``Unavailable`` (retry-after 1 s), every worker is
  killed (SIGKILL through its pidfd, so never another process that reused its pid; this also covers
  workers whose forkserver died), and a supervisor thread starts a new crew (``on_change(False)``,
  then ``on_change(True)`` once it is ready);
* a caller waiting for a job bounds its own wait: when no item has finished anywhere in the pool for
  ``stall_seconds`` while jobs wait (a worker that hangs: stopped, deadlocked, swapping, or a crew that
  cannot be started), the jobs fail with ``Unavailable`` and the crew is rebuilt the same way;
* ``close`` kills the workers without waiting for what they run.

Workers are started by multiprocessing's forkserver (safe next to gRPC's threads; a killed forkserver
or resource tracker is started again by multiprocessing with the next crew); each first runs
``initializer(*initargs)`` once (what it needs for every item, e.g. a key ring), then ``work(item)``
per item. Where no crew can be started ``MAX_START_ATTEMPTS`` times in a row, jobs fail with
``NoWorkers`` and the caller does the work itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

from lac.common.errors import Unavailable

__all__ = ["WorkerPool", "NoWorkers", "MAX_START_ATTEMPTS"]

log = logging.getLogger(__name__)

START_SECONDS = 60.0
"""A new worker must have run its initializer within this long (the forkserver's first start imports the
preloaded modules)."""
MAX_START_ATTEMPTS = 3
"""Crews that fail to start in a row before the pool gives up (``NoWorkers``)."""
START_RETRY_SECONDS = (0.5, 2.0)
JOIN_SECONDS = 2.0
"""How long a torn-down crew's threads and processes are waited for (they were killed)."""


class NoWorkers(Exception):
    """No worker process can be started here: do the work in this process."""


def _serve(conn: Connection, initializer: Callable[..., None], initargs: tuple, work: Callable[[Any], Any]) -> None:
    """A worker's life: the initializer, a handshake (its pid), then one reply per item until the pipe closes."""
    initializer(*initargs)
    conn.send(os.getpid())
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the server closed the pipe, or is gone
            return
        try:
            reply = ForkingPickler.dumps((True, work(item)))
        except Exception as exc:  # the item's error, or a result that cannot be pickled, goes back to the caller
            try:
                reply = ForkingPickler.dumps((False, exc))
            except Exception:
                reply = ForkingPickler.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        try:
            conn.send_bytes(reply)
        except OSError:
            return


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (None where the system has none); ``ProcessLookupError`` if it ended."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:  # e.g. ENOSYS: a kernel before 5.3
        return None


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    conn: Connection
    pid: int
    pidfd: int | None
    _polling: threading.Lock = field(default_factory=threading.Lock)  # its exit code is read from a pipe

    @property
    def sentinels(self) -> list[int]:
        """Ready once the process ended (the forkserver's report, and the kernel's through the pidfd)."""
        return [self.process.sentinel] + ([self.pidfd] if self.pidfd is not None else [])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def exit_text(self) -> str:
        """How it ended, as far as its forkserver reported within half a second."""
        with self._polling:
            wait([self.process.sentinel], 0.5)
            code = self.process.exitcode
        if code is None or code == 255:  # 255: its forkserver ended before it could report
            return "ended"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


@dataclass(eq=False)
class _Job:
    items: Sequence[Any]
    results: list[Any]
    left: int
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class _Crew:
    workers: list[_Worker]
    tasks: queue.SimpleQueue  # (job, index), then one None per lane when the crew is torn down
    lanes: list[threading.Thread] = field(default_factory=list)


class WorkerPool:
    """``size`` worker processes that each run ``initializer(*initargs)`` once, then ``work(item)`` for the
    items of the jobs they are given (see the module docstring). ``what`` names them in logs and errors,
    ``stall_setting`` the setting ``stall_seconds`` comes from; ``preload``: the modules the forkserver
    imports once for all workers."""

    def __init__(
        self,
        size: int,
        initializer: Callable[..., None],
        initargs: tuple,
        work: Callable[[Any], Any],
        *,
        stall_seconds: float,
        stall_setting: str = "stall_seconds",
        preload: Sequence[str] = (),
        on_change: Callable[[bool], None] | None = None,
        what: str = "worker",
    ):
        if not stall_seconds > 0:
            raise ValueError(f"{stall_setting} must be positive")
        self.size, self.stall_seconds, self.stall_setting, self.what = size, stall_seconds, stall_setting, what
        self._target = (initializer, initargs, work)
        self._preload = list(preload)
        self._on_change = on_change
        self.deaths = 0  # times a worker (or its forkserver) ended on its own
        self.stalls = 0  # times no item finished within stall_seconds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._crew: _Crew | None = None
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()  # for the current crew, or the next one
        self._jobs: set[_Job] = set()  # not yet done, all in self._tasks
        self._progress = time.monotonic()  # when an item last finished (or work arrived at an idle pool)
        self._ok = True  # False from a failure until a new crew is ready
        self._broken_at = 0.0  # when it last became False
        self._told = True  # what on_change last said
        self._tell = threading.Lock()
        self._gave_up: BaseException | None = None
        self._closed = False
        self._supervisor: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()

    # -- what callers use ----------------------------------------------------------------------

    @property
    def ok(self) -> bool:
        """False while the pool is broken and its new crew is not ready yet."""
        return self._ok

    @property
    def gave_up(self) -> bool:
        """Whether no crew could be started (every job fails with ``NoWorkers``)."""
        return self._gave_up is not None

    def start(self) -> list[int]:
        """Start the workers now and wait for them (blocking); their pids, [] if none could be started or
        the pool was closed meanwhile. Never raises."""
        self._supervise_soon()
        with self._changed:
            self._changed.wait_for(
                lambda: self._crew is not None or self._closed or self._gave_up is not None,
                START_SECONDS * MAX_START_ATTEMPTS,
            )
        return self.pids()

    def pids(self) -> list[int]:
        """The process ids of the current crew ([] before it started, while it is rebuilt, after close)."""
        with self._lock:
            return [w.pid for w in self._crew.workers] if self._crew is not None else []

    def map(self, items: Sequence[Any]) -> list[Any]:
        """``work(item)`` for each item on the workers, in order (blocking). ``Unavailable`` if a worker died,
        the pool stalled or was closed; ``NoWorkers`` if no worker process can be started here; the error a
        ``work(item)`` raised."""
        job = self._submit(items)
        try:
            while True:
                try:
                    return job.future.result(timeout=self._stall_left())
                except TimeoutError:
                    self._check_stall()
        finally:
            self._cancel(job)

    async def amap(self, items: Sequence[Any]) -> list[Any]:
        """``map`` without blocking the event loop."""
        job = self._submit(items)
        result = asyncio.wrap_future(job.future)
        try:
            while True:
                done, _ = await asyncio.wait({result}, timeout=self._stall_left())
                if done:
                    return result.result()
                self._check_stall()
        finally:
            self._cancel(job)

    def close(self) -> None:
        """Kill the workers (without waiting for what they run) and fail the waiting jobs; later jobs are
        refused with ``Unavailable``. Returns within about ``JOIN_SECONDS``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs = self._detach()
            os.write(self._wake_w, b"x")  # the supervisor stops, killing a crew it is starting
            self._changed.notify_all()
        self._fail(jobs, lambda: Unavailable("the curator is stopping", retry_after=1))
        if self._supervisor is not None:
            self._supervisor.join(JOIN_SECONDS)
        if self._supervisor is None or not self._supervisor.is_alive():  # else it may still wait on them
            os.close(self._wake_r)
            os.close(self._wake_w)

    # -- jobs ------------------------------------------------------------------------------------

    def _submit(self, items: Sequence[Any]) -> _Job:
        job = _Job(items, [None] * len(items), len(items))
        with self._lock:
            if self._closed:
                raise Unavailable("the curator is stopping", retry_after=1)
            if self._gave_up is not None:
                raise NoWorkers(str(self._gave_up))
            if not items:
                job.future.set_result([])
                return job
            if not self._jobs:
                self._progress = time.monotonic()
            self._jobs.add(job)
            for i in range(len(items)):
                self._tasks.put((job, i))
        self._supervise_soon()
        return job

    def _cancel(self, job: _Job) -> None:
        """The caller stopped waiting (done, failed, or cancelled): its items not sent yet are skipped."""
        with self._lock:
            self._jobs.discard(job)
        job.future.cancel()

    def _done(self, job: _Job, i: int, ok: bool, value: Any) -> None:
        with self._lock:
            self._progress = time.monotonic()
            if job not in self._jobs:
                return
            if not ok:
                self._jobs.discard(job)
            else:
                job.results[i] = value
                job.left -= 1
                if job.left:
                    return
                self._jobs.discard(job)
        if ok:
            job.future.set_result(job.results)
        else:
            job.future.set_exception(value)

    def _stall_left(self) -> float:
        return max(0.05, self._progress + self.stall_seconds - time.monotonic())

    def _check_stall(self) -> None:
        """Tear the crew down if jobs wait and no item finished for ``stall_seconds``."""
        with self._lock:
            if not self._jobs or time.monotonic() - self._progress < self.stall_seconds:
                return
            self.stalls += 1
            jobs = self._detach()
        message = (
            f"no {self.what} process finished any work within {self.stall_seconds:g} s ({self.stall_setting}): "
            f"taken to hang, they are killed and started again"
        )
        log.error("%s; %d job(s) failed (retryable)", message, len(jobs), extra={"failure_reason": "stalled"})
        self._fail(jobs, lambda: Unavailable(f"{message}; nothing of this call was stored: retry", retry_after=1))
        self._tell_change()

    def _broken(self, crew: _Crew, why: str) -> None:
        """A worker of ``crew`` ended (or lost its pipe): fail every job, kill the crew, start a new one."""
        with self._lock:
            if crew is not self._crew or self._closed:
                return  # torn down already
            self.deaths += 1
            jobs = self._detach()
        log.error(
            "%s process %s: %d job(s) failed (retryable); its processes are killed and started again",
            self.what,
            why,
            len(jobs),
            extra={"failure_reason": "worker_died"},
        )
        self._fail(
            jobs,
            lambda: Unavailable(f"a {self.what} process {why}; nothing of this call was stored: retry", retry_after=1),
        )
        self._tell_change()

    def _detach(self) -> list[_Job]:
        """(Under the lock.) Kill the crew, hand its lanes their end, take the jobs; the supervisor cleans up."""
        crew, self._crew = self._crew, None
        jobs, self._jobs = list(self._jobs), set()
        self._tasks = queue.SimpleQueue()
        if crew is not None:
            for w in crew.workers:
                w.kill()
            for _ in crew.lanes:
                crew.tasks.put(None)
        if not self._closed:
            if self._ok:
                self._ok, self._broken_at = False, time.monotonic()
            os.write(self._wake_w, b"x")
        return jobs

    @staticmethod
    def _fail(jobs: list[_Job], error: Callable[[], BaseException]) -> None:
        for job in jobs:  # each its own exception: their callers raise them in their own threads
            with contextlib.suppress(Exception):  # InvalidStateError: cancelled meanwhile
                job.future.set_exception(error())

    def _tell_change(self) -> None:
        """``on_change(ok)`` when ``ok`` changed (in order: the last call says what holds now)."""
        if self._on_change is None:
            return
        with self._tell:
            ok = self._ok
            if ok != self._told:
                self._told = ok
                try:
                    self._on_change(ok)
                except Exception:
                    log.exception("%s: on_change failed", self.what)

    # -- the lanes ---------------------------------------------------------------------------------

    def _lane(self, crew: _Crew, w: _Worker) -> None:
        """Serve one worker: send it an item, read its result from its own pipe, until the crew ends."""
        why = None
        try:
            while (task := crew.tasks.get()) is not None:
                job, i = task
                if job.future.done():  # failed, or its caller gave up
                    continue
                try:
                    w.conn.send(job.items[i])
                    if w.conn not in wait([w.conn, *w.sentinels]):
                        why = f"{w.pid} {w.exit_text()}"
                        return
                    ok, value = w.conn.recv()
                except (OSError, EOFError):  # the worker ended during the exchange
                    why = f"{w.pid} {w.exit_text()}"
                    return
                except Exception as exc:  # a result this process cannot unpickle
                    ok, value = False, exc
                self._done(job, i, ok, value)
        finally:
            if why is not None:
                self._broken(crew, why)

    # -- the supervisor: starts crews, watches them while idle ---------------------------------------

    def _supervise_soon(self) -> None:
        with self._lock:
            if self._supervisor is None and not self._closed and self._gave_up is None:
                self._supervisor = threading.Thread(target=self._supervise, name=f"lac-{self.what}-pool", daemon=True)
                self._supervisor.start()

    def _supervise(self) -> None:
        failures = 0
        crew: _Crew | None = None
        try:
            while not self._closed:
                if crew is None:
                    try:
                        crew = self._spawn()
                    except Exception as exc:
                        if self._closed:
                            break
                        failures += 1
                        if self._start_failed(exc, failures):
                            return
                        continue
                    failures = 0
                    if not self._install(crew):
                        crew = None  # closed meanwhile: killed and cleaned up
                        break
                    self._tell_change()
                ready = wait([self._wake_r, *(s for w in crew.workers for s in w.sentinels)])
                if self._wake_r in ready:
                    os.read(self._wake_r, 1 << 10)
                dead = [w for w in crew.workers if any(s in ready for s in w.sentinels)]
                if dead:
                    self._broken(crew, f"{dead[0].pid} {dead[0].exit_text()}")
                if crew is not self._crew:
                    self._clean(crew)
                    crew = None
        except Exception:  # a bug here must not leave callers waiting: they fail at their stall bound
            log.exception("%s: the pool's supervisor failed; the next job starts another", self.what)
        finally:
            if crew is not None:
                with self._lock:
                    if crew is self._crew:
                        self._detach()
                self._clean(crew)
            with self._lock:
                if not self._closed:
                    self._supervisor = None

    def _start_failed(self, exc: Exception, failures: int) -> bool:
        """Note a crew that could not start; True once the pool gives up."""
        log.error(
            "cannot start %s processes (%s: %s), attempt %d of %d%s",
            self.what,
            type(exc).__name__,
            exc,
            failures,
            MAX_START_ATTEMPTS,
            "" if failures < MAX_START_ATTEMPTS else ": giving up, the work is done in this process",
        )
        if failures < MAX_START_ATTEMPTS:
            wait([self._wake_r], START_RETRY_SECONDS[min(failures, len(START_RETRY_SECONDS)) - 1])
            return False
        with self._lock:
            self._gave_up = exc
            jobs, self._jobs = list(self._jobs), set()
            self._ok = True  # the callers work in process
            self._changed.notify_all()
        self._fail(jobs, lambda: NoWorkers(str(exc)))
        self._tell_change()
        return True

    def _install(self, crew: _Crew) -> bool:
        """Make ``crew`` the pool's (False, and the crew killed, if the pool was closed meanwhile)."""
        with self._lock:
            closed, again = self._closed, not self._ok
            if not closed:
                self._start_lanes(crew)
        if closed:
            for w in crew.workers:
                w.kill()
            self._clean(crew)
            return False
        pids = ", ".join(str(w.pid) for w in crew.workers)
        if again:
            log.warning(
                "%s processes running again after %.1f s (%s)", self.what, time.monotonic() - self._broken_at, pids
            )
        else:
            log.info("%s processes ready: %s", self.what, pids)
        return True

    def _start_lanes(self, crew: _Crew) -> None:
        """(Under the lock.) ``crew`` takes the waiting tasks; a lane per worker."""
        crew.tasks, self._crew, self._ok = self._tasks, crew, True
        self._progress = time.monotonic()  # waiting for the crew was no stall of the work
        for w in crew.workers:
            lane = threading.Thread(target=self._lane, args=(crew, w), name=f"lac-{self.what}-lane", daemon=True)
            crew.lanes.append(lane)
            lane.start()
        self._changed.notify_all()

    def _spawn(self) -> _Crew:
        """Start ``size`` workers and wait for their handshakes (blocking)."""
        mp = multiprocessing.get_context("forkserver")
        mp.set_forkserver_preload(self._preload)
        started: list[tuple[BaseProcess, Connection]] = []
        workers: list[_Worker] = []
        try:
            for _ in range(self.size):
                ours, theirs = mp.Pipe()
                process = mp.Process(target=_serve, args=(theirs, *self._target), name=f"lac-{self.what}", daemon=True)
                started.append((process, ours))
                try:
                    process.start()
                finally:
                    theirs.close()  # the worker has its own copy: ours must not keep the pipe open after it ends
            deadline = time.monotonic() + START_SECONDS
            for p, conn in started:
                while conn not in (
                    ready := wait([conn, p.sentinel, self._wake_r], max(0.0, deadline - time.monotonic()))
                ):
                    if self._closed:
                        raise RuntimeError("closed while starting")
                    if not ready:
                        raise RuntimeError(f"a {self.what} process did not start within {START_SECONDS:g} s")
                    if self._wake_r in ready:  # a failure of jobs meanwhile: this crew is still wanted
                        os.read(self._wake_r, 1 << 10)
                    else:
                        raise RuntimeError(f"a {self.what} process ended while starting")
                try:
                    pid = conn.recv()
                except EOFError:
                    raise RuntimeError(f"a {self.what} process ended while starting") from None
                workers.append(_Worker(p, conn, pid, _pidfd(pid)))
        except BaseException:
            for w in workers:
                w.kill()
            for p, _ in started:
                if p.pid is not None and p.exitcode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)  # none can have reused its pid: its sentinel is not ready
            self._clean(_Crew(workers, queue.SimpleQueue()), [p for p, _ in started], [c for _, c in started])
            raise
        return _Crew(workers, queue.SimpleQueue())

    def _clean(
        self, crew: _Crew, processes: list[BaseProcess] | None = None, conns: list[Connection] | None = None
    ) -> None:
        """After a crew was killed: wait (bounded) for its lanes and processes, then close what they held."""
        deadline = time.monotonic() + JOIN_SECONDS
        stuck = set()
        for lane, w in zip(crew.lanes, crew.workers):
            lane.join(max(0.0, deadline - time.monotonic()))
            if lane.is_alive():
                stuck.add(id(w))  # still polls the worker's descriptors: leave them open
        for p in processes if processes is not None else [w.process for w in crew.workers]:
            p.join(max(0.0, deadline - time.monotonic()))
        for w in crew.workers:
            if id(w) in stuck:
                continue
            if w.pidfd is not None:
                os.close(w.pidfd)
            w.conn.close()
            if w.process.exitcode is not None:
                w.process.close()
        for conn in conns or ():
            conn.close()
