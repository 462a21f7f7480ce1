#!/usr/bin/env python3
"""Soak run of the whole stack (not a CI test): a curator and a shuffler as real ``lac ... serve`` processes over
TLS (the curator mutual TLS, clients with bearer tokens), for ``--minutes`` (default 30), while

* steady clients submit real texts privatized by the SDK's Localizer (the curator's deployment) and sealed to the
  curator's key, through the SDK (``ShufflerClient.submit_prepared``, one token per client, each client at most
  once per accounting window), and bursty clients submit a burst every few minutes;
* an analyst releases (posterior, ε = 0.2, forced) every minute and exports a closed window every few minutes;
* each service is SIGKILLed and restarted several times, the shuffler's state directory (a small tmpfs) is filled
  up for a while, and both services are backed up online, stopped and restored into new state directories.

A report counts as acknowledged when the SDK returned its ack; an unacknowledged one is sent again later with the
same idempotency id and sealed bytes. At the end the shuffler is drained (filler reports from clients kept for
that, then flushes) and the invariants are checked and printed:

1. every acknowledged report is stored at the curator (its report id in the curator's ``report_ids``), and
   nothing else is (no report the run did not make);
2. none is stored twice (the curator's stored report count equals its distinct report ids);
3. every batch released is ingested once (shuffler released = forwarded = the curator's distinct batches; no
   dead letter);
4. the ledger equals the releases returned: every release request id is sent again at the end (idempotent) and
   the ε charged to each window equals the sum over the returned releases covering it;
5. RSS and open file descriptors flat: per process life of at least 3 minutes, the median of its last third
   minus that of its first third (after its first minute) is at most ``FD_BOUND`` fds and, for the shuffler (whose
   state is bounded: payloads leave with their batches), ``RSS_BOUND``; the curator's releases read every stored
   report, so its working set grows with the data during the run (reported with the reports stored meanwhile) and
   its leak check is ``FINAL_RELEASES`` releases over the drained, fixed data: RSS after the last minus after the
   third at most ``FINAL_RSS_BOUND``. No process the curator started (its ingest workers) outlives a SIGKILL of it
   by more than 15 s;
6. no background task dead: no "background task ... failed" in either log, both services SERVING at the end, and
   the shuffler's disk-full episode ended in SERVING again;
7. the backup/restore gave the same state (statuses before = after).

It prints the load average at the start and the end; run it when the machine is not too busy (``uptime``). Needs
root for the tmpfs (else the disk-full episode is skipped and said so) and ``lac data``'s public corpus.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from benchkit import load

from lac.common import envelope
from lac.common.health import check as health_check
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc
from lac.suite import procs

RSS_BOUND = 64 * 2**20  # bytes the shuffler's RSS may grow between the first and last third of a life
FD_BOUND = 32  # open file descriptors a process may gain meanwhile: each of the soak's 18 client threads holds a
# connection from its first call on
FINAL_RSS_BOUND = 32 * 2**20  # the curator's RSS growth from the third to the last of its final releases
FINAL_RELEASES = 8
WINDOW_SECONDS = 60.0
MIN_BATCH = 20
RELEASE_EPSILON = 0.2
ORPHAN_SECONDS = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lac(*argv: str) -> subprocess.CompletedProcess:
    """``lac ARGV`` as its own process (an operator's command next to the live services)."""
    return subprocess.run([sys.executable, "-m", "lac.common", *argv], capture_output=True, text=True, timeout=600)


def _children(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += [int(child), *_children(int(child))]
    return out


def _rss_and_fds(pid: int) -> tuple[int, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


@dataclass
class Life:
    """One process of a service, from its start to its end: (seconds since start, RSS, fds) samples."""

    pid: int
    started: float
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    ended: str = ""

    def growth(self) -> tuple[float, float] | None:
        """(RSS, fds) growth: the median of the last third of the samples minus that of the first third, leaving
        out the first minute; None for a life shorter than 3 minutes."""
        usable = [x for x in self.samples if x[0] >= 60]
        if len(usable) < 9 or usable[-1][0] - usable[0][0] < 120:
            return None
        third = len(usable) // 3

        def change(k: int) -> float:
            return statistics.median(x[k] for x in usable[-third:]) - statistics.median(x[k] for x in usable[:third])

        return change(1), change(2)


class Managed:
    """A service run as ``lac <name> serve`` on a fixed port, killed and restarted at will; samples its process."""

    def __init__(self, name: str, args, workdir: Path, port: int, tls):
        self.name, self.args, self.workdir, self.port, self.tls = name, args, workdir, port, tls
        self.service: procs.Service | None = None
        self.lives: list[Life] = []
        self.orphans: list[int] = []
        self.lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> float:
        t0 = time.monotonic()
        self.service = procs.start(self.name, self.args(), self.workdir, timeout=600, tls=self.tls, port=self.port)
        with self.lock:
            self.lives.append(Life(self.service.process.pid, time.monotonic()))
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL; then check that every process it started ends too (within ORPHAN_SECONDS)."""
        assert self.service is not None
        pid = self.service.process.pid
        below = _children(pid)
        self.service.process.kill()
        self.service.process.wait()
        with self.lock:
            self.lives[-1].ended = "SIGKILL"
        deadline = time.monotonic() + ORPHAN_SECONDS
        while (alive := [c for c in below if Path(f"/proc/{c}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.orphans += alive

    def stop(self) -> int:
        assert self.service is not None
        code = self.service.stop(60)
        with self.lock:
            self.lives[-1].ended = f"SIGTERM (exit {code})"
        return code

    def sample(self) -> None:
        with self.lock:
            if not self.lives or self.lives[-1].ended:
                return
            life = self.lives[-1]
        got = _rss_and_fds(life.pid)
        if got is not None:
            life.samples.append((time.monotonic() - life.started, *got))

    def healthy(self) -> bool:
        try:
            return health_check(self.address, self.tls, timeout=10)
        except grpc.RpcError:
            return False


class Reports:
    """Real texts of the simulated users, privatized by the SDK's Localizer for the curator's deployment (as an
    app's device does) and sealed to the curator's key: (report id, ClientReport) each."""

    def __init__(self, localizer, key, texts: list[str]):
        self.localizer, self.key, self.texts = localizer, key, texts
        self.lock = threading.Lock()
        self.next_text = 0
        self.made: set[bytes] = set()

    def take(self) -> tuple[bytes, shuffler_pb2.ClientReport]:
        from lac.client.submit import report_content

        while True:
            with self.lock:
                text = self.texts[self.next_text % len(self.texts)]
                self.next_text += 1
            privatized = self.localizer.privatize(text)
            if any(privatized.sentences):
                break
        content = report_content(privatized)
        sealed = envelope.seal(content, self.key)
        with self.lock:
            self.made.add(content.report_id)
        return content.report_id, shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=sealed)


class Clients:
    """The simulated clients: tokens handed out round-robin (each client at most once per accounting window while
    the pool lasts), the SDK per thread, every report's fate."""

    def __init__(self, tokens: list[str], fillers: list[str], shuffler: Managed, key, ca):
        self.tokens, self.fillers = tokens, fillers
        self.shuffler, self.key, self.ca = shuffler, key, ca
        self.next_client = 0
        self.lock = threading.Lock()
        self.local = threading.local()
        self.acked: set[bytes] = set()
        self.waiting: dict[bytes, tuple[str, shuffler_pb2.ClientReport]] = {}  # unacknowledged: sent again later
        self.errors: Counter[str] = Counter()
        self.in_flight = 0
        self.idle = threading.Condition(self.lock)

    def _sdk(self):
        from lac.client import ShufflerClient
        from lac.common.tls import ClientTls

        sdk = getattr(self.local, "sdk", None)
        if sdk is None:
            sdk = ShufflerClient(
                self.shuffler.address,
                curator_key=self.key,
                tls_config=ClientTls(Path(self.ca)),
                attempts=3,
                timeout=20,
                connect_timeout=5,
            )
            self.local.sdk = sdk
        return sdk

    def client(self) -> str:
        with self.lock:
            token = self.tokens[self.next_client % len(self.tokens)]
            self.next_client += 1
        return token

    def send(self, token: str, rid: bytes, report: shuffler_pb2.ClientReport) -> bool:
        """One submission through the SDK (its own retries included); True once acknowledged."""
        from lac.client.errors import LacClientError

        with self.lock:
            self.in_flight += 1
        try:
            self._sdk().submit_prepared([report], token=token)
            ok = True
        except LacClientError as exc:
            ok = False
            self.errors[f"{type(exc).__name__}: {getattr(exc, 'code', lambda: '')() or ''}".rstrip(": ")] += 1
        finally:
            with self.lock:
                self.in_flight -= 1
                self.idle.notify_all()
        with self.lock:
            if ok:
                self.acked.add(rid)
                self.waiting.pop(rid, None)
            else:
                self.waiting[rid] = (token, report)
        return ok

    def resend(self) -> None:
        """Send every unacknowledged report again (same token, idempotency id and bytes)."""
        with self.lock:
            again = list(self.waiting.items())
        for rid, (token, report) in again:
            self.send(token, rid, report)

    def wait_idle(self) -> None:
        with self.lock:
            self.idle.wait_for(lambda: self.in_flight == 0, timeout=120)


def _operator_md(token: str):
    return (("authorization", f"Bearer {token}"),)


def shuffler_status(shf: Managed, token: str) -> shuffler_pb2.ShufflerStatus:
    from lac.common import tls

    with tls.channel(shf.address, shf.tls) as ch:
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(
            shuffler_pb2.ShufflerStatusRequest(), metadata=_operator_md(token), timeout=30
        )


def shuffler_flush(shf: Managed, token: str) -> None:
    from lac.common import tls

    with tls.channel(shf.address, shf.tls) as ch:
        shuffler_pb2_grpc.ShufflerStub(ch).Flush(shuffler_pb2.FlushRequest(), metadata=_operator_md(token), timeout=60)


def curator_status(cur: Managed) -> curator_pb2.CuratorStatus:
    from lac.common import tls

    with tls.channel(cur.address, cur.tls) as ch:
        return curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=60)


def _until(predicate, timeout: float, step: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            if predicate():
                return True
        time.sleep(step)
    return False


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.root = Path(args.dir or tempfile.mkdtemp(prefix="lac-soak-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.events: list[str] = []
        self.stop_traffic = threading.Event()
        self.paused = threading.Event()
        self.releasing = threading.Lock()  # held by the analyst for a release, by the backup while it runs
        self.release_ids: list[str] = []
        self.answered: dict[str, object] = {}  # request id -> the ReleaseInfo returned for it during the run
        self.releases_ok = 0
        self.release_errors: Counter[str] = Counter()
        self.exports: list[tuple[int, int]] = []
        self.export_errors: Counter[str] = Counter()
        self.disk: dict[str, float | bool | int] = {}
        self.restored: dict[str, bool] = {}
        self.crashes: list[str] = []  # the soak's own threads that failed (restarted; the run then fails)
        self.stored: list[tuple[float, int]] = []  # (when, reports the curator holds)
        self.final_rss: list[int] = []

    def guarded(self, target):
        """``target`` run until the traffic stops: an exception is noted (the run fails) and it is started again."""

        def run() -> None:
            while not self.stop_traffic.is_set():
                try:
                    target()
                    return
                except Exception as exc:
                    self.crashes.append(f"{target.__name__}: {type(exc).__name__}: {exc}")
                    self.note(f"soak thread {target.__name__} failed, started again: {traceback.format_exc()}")
                    time.sleep(1)

        return threading.Thread(target=run, daemon=True)

    def note(self, text: str) -> None:
        line = f"[{(time.monotonic() - self.t0) / 60:6.2f} min, load {load()}] {text}"
        self.events.append(line)
        print(line, flush=True)

    # -- set-up ------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        from lac.shuffler.auth import add_client, add_clients

        self.pki = procs.LocalDeployment.create(self.root / "keys")
        self.fs = self.root / "shuffler-fs"
        self.fs.mkdir(exist_ok=True)
        self.tmpfs = False
        if os.geteuid() == 0:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.args.tmpfs_mib}m,mode=0700", "tmpfs", str(self.fs)],
                capture_output=True,
                text=True,
            )
            self.tmpfs = done.returncode == 0
            if not self.tmpfs:
                self.note(f"no tmpfs ({done.stderr.strip()}): the disk-full episode is skipped")
        else:
            self.note("not root: no tmpfs, the disk-full episode is skipped")
        self.tokens_file = self.root / "clients.tokens"
        n = self.args.clients
        ids = [f"c{i}" for i in range(n)]
        tokens = add_clients(self.tokens_file, ids)
        fillers = add_clients(self.tokens_file, [f"filler{i}" for i in range(MIN_BATCH * 20)])
        self.operator = add_client(self.tokens_file, "soak-operator", role="operator")
        self.shuffler_state = self.fs / "state"
        self.curator_state = self.root / "curator"
        corpus = Path(os.environ.get("LAC_DATA_DIR", Path.home() / ".cache" / "lac")) / "corpora" / "public.txt"
        if not corpus.exists():
            raise SystemExit(f"no public corpus at {corpus}: run `lac data` first")
        period = [
            "--window-seconds",
            str(WINDOW_SECONDS),
            "--period-days",
            "1",
            "--max-windows-per-client-per-period",
            "1000",
        ]
        self.curator = Managed(
            "curator",
            lambda: [
                "--state-dir",
                str(self.curator_state),
                "--public-corpus",
                str(corpus),
                "--no-clean-estimate",
                "--min-signal-share",
                "0",
                "--budget-epsilon",
                "1000",
                "--budget-delta",
                "0.5",
                "--export-identities",
                "analyst",
                "--log-format",
                "json",
                *period,
                *self.pki.curator_args(),
            ],
            self.root / "curator-proc",
            _free_port(),
            self.pki.client_tls("operator"),
        )
        self.shuffler = Managed(
            "shuffler",
            lambda: [
                "--state-dir",
                str(self.shuffler_state),
                "--tokens-file",
                str(self.tokens_file),
                "--curator",
                self.curator.address,
                "--min-batch",
                str(MIN_BATCH),
                "--release-interval-seconds",
                "15",
                "--min-free-disk-bytes",
                str(8 * 2**20),
                "--forward-retry-max-seconds",
                "2",
                "--log-format",
                "json",
                *period,
                *self.pki.shuffler_args(),
            ],
            self.root / "shuffler-proc",
            _free_port(),
            self.pki.client_tls(),
        )
        self.note(f"state under {self.root}; curator :{self.curator.port}, shuffler :{self.shuffler.port}")
        self.note(f"curator started in {self.curator.start():.1f} s")
        self.note(f"shuffler started in {self.shuffler.start():.1f} s")

        from lac.client import ShufflerClient
        from lac.common.tls import ClientTls
        from lac.suite.data import user_texts

        key = self.pki.curator_public_key()
        with ShufflerClient(self.shuffler.address, key, ClientTls(Path(self.pki.ca)), token=tokens[0]) as sdk:
            localizer = sdk.localizer("balanced")
        texts = list(user_texts(0))
        random.Random(self.args.seed).shuffle(texts)
        self.reports = Reports(localizer, key, texts)
        self.clients = Clients(tokens, fillers, self.shuffler, key, self.pki.ca)

    # -- traffic -----------------------------------------------------------------------------------------------

    def _wait_unpaused(self) -> bool:
        while self.paused.is_set() and not self.stop_traffic.is_set():
            time.sleep(0.2)
        return not self.stop_traffic.is_set()

    def steady(self) -> None:
        interval = 1.0 / self.args.rate
        last_resend = time.monotonic()
        while self._wait_unpaused():
            started = time.monotonic()
            rid, report = self.reports.take()
            self.clients.send(self.clients.client(), rid, report)
            if time.monotonic() - last_resend > 10:
                self.clients.resend()
                last_resend = time.monotonic()
            self.stop_traffic.wait(max(0.0, interval - (time.monotonic() - started)))

    def bursty(self) -> None:
        with ThreadPoolExecutor(16) as pool:
            while not self.stop_traffic.wait(self.args.burst_every):
                if not self._wait_unpaused():
                    break
                made = [self.reports.take() for _ in range(self.args.burst)]
                sent = list(pool.map(lambda r: self.clients.send(self.clients.client(), *r), made))
                self.note(f"burst of {len(made)} reports: {sum(sent)} acknowledged at once")

    def analyst(self) -> None:
        from lac.analyst import CuratorClient
        from lac.analyst.client import AnalystError, new_request_id

        last_export = time.monotonic()
        with CuratorClient.with_tls(
            self.curator.address, self.pki.client_tls("analyst"), timeout=60, release_timeout=300
        ) as c:
            while not self.stop_traffic.wait(self.args.release_every):
                if not self._wait_unpaused():
                    break
                rid = new_request_id()
                t = time.monotonic()
                with self.releasing:  # no release runs across the backup's statuses and copies
                    self.release_ids.append(rid)
                    try:
                        info = c.release(RELEASE_EPSILON, 1e-6, force=True, request_id=rid)
                        self.answered[rid] = info
                        self.releases_ok += 1
                        self.note(
                            f"release {info.release_id} of windows {info.first_window}..{info.last_window} in "
                            f"{time.monotonic() - t:.1f} s"
                        )
                    except AnalystError as exc:
                        self.release_errors[f"{exc.code}: {exc.details[:90]}"] += 1
                        self.note(
                            f"release refused after {time.monotonic() - t:.1f} s: {exc.code}: {exc.details[:400]}"
                        )
                if time.monotonic() - last_export > self.args.export_every:
                    last_export = time.monotonic()
                    now = int(time.time() // WINDOW_SECONDS)
                    try:  # the newest closed window with reports (the operator's exact view picks it)
                        window = max(w for w in curator_status(self.curator).reports_by_window if w < now)
                        self.exports.append((window, c.export_reports(window).rows))
                        self.note(f"export of window {window}: {self.exports[-1][1]} reports")
                    except (AnalystError, grpc.RpcError, ValueError) as exc:
                        self.export_errors[str(exc)[:100]] += 1

    def sampler(self) -> None:
        n = 0
        while not self.stop_traffic.wait(5):
            self.curator.sample()
            self.shuffler.sample()
            n += 1
            if n % 6 == 0:  # every 30 s: how many reports the curator holds (the operator's exact count)
                with contextlib.suppress(grpc.RpcError):
                    self.stored.append((time.monotonic(), curator_status(self.curator).reports))

    def stored_during(self, life: Life) -> int:
        """Reports the curator stored during ``life`` (from the 30 s timeline)."""
        end = life.started + (life.samples[-1][0] if life.samples else 0)
        inside = [n for t, n in self.stored if life.started <= t <= end]
        return inside[-1] - inside[0] if inside else 0

    # -- the episodes --------------------------------------------------------------------------------------------

    def kill(self, service: Managed) -> None:
        service.kill()
        self.note(f"SIGKILL {service.name}; restarted in {service.start():.1f} s")

    def disk_full(self, seconds: float) -> None:
        if not self.tmpfs:
            return
        filler = self.fs / "filler"
        with open(filler, "wb") as f:
            block = b"\0" * 2**20
            with contextlib.suppress(OSError):
                while True:
                    f.write(block)
                    f.flush()
        self.note(f"disk full: {filler.stat().st_size >> 20} MiB of filler on the shuffler's tmpfs")
        t = time.monotonic()
        refused = _until(lambda: not self.shuffler.healthy(), 60, 0.5)
        self.disk["not_serving_after_s"] = time.monotonic() - t if refused else -1.0
        errors_before = sum(self.clients.errors.values())
        time.sleep(seconds)
        self.disk["client_errors_during"] = sum(self.clients.errors.values()) - errors_before
        filler.unlink()
        t = time.monotonic()
        back = _until(self.shuffler.healthy, 120, 0.5)
        self.disk["serving_again_after_s"] = time.monotonic() - t if back else -1.0
        self.disk["recovered"] = back
        self.note(
            f"disk freed: NOT_SERVING {self.disk['not_serving_after_s']:.1f} s after it filled, SERVING again "
            f"{self.disk['serving_again_after_s']:.1f} s after it was freed; {self.disk['client_errors_during']} "
            f"client errors meanwhile"
        )

    def backup_restore(self) -> None:
        self.paused.set()
        self.clients.wait_idle()
        with self.releasing:  # a release in flight ends first (it would land on one side of the copies only)
            self._backup_restore()
        self.paused.clear()

    def _backup_restore(self) -> None:
        shuffler_flush(self.shuffler, self.operator)
        _until(lambda: shuffler_status(self.shuffler, self.operator).batches_pending == 0, 300)
        before_s, before_c = shuffler_status(self.shuffler, self.operator), curator_status(self.curator)
        backups = self.root / f"backup-{int(time.time())}"
        for argv in (
            ["shuffler", "backup", str(backups / "shuffler"), "--state-dir", str(self.shuffler_state)]
            + ["--tokens-file", str(self.tokens_file)],
            ["curator", "backup", str(backups / "curator"), "--state-dir", str(self.curator_state)],
        ):
            done = _lac(*argv)
            if done.returncode:
                raise RuntimeError(f"lac {' '.join(argv)}: {done.stderr}")
            self.note(done.stdout.strip())
        self.shuffler.stop()
        self.curator.stop()
        old_s, old_c, old_tokens = self.shuffler_state, self.curator_state, self.tokens_file
        self.shuffler_state, self.curator_state = self.fs / "restored", self.root / "curator-restored"
        self.tokens_file = self.root / "clients-restored.tokens"
        for argv in (
            ["shuffler", "restore", str(backups / "shuffler"), "--state-dir", str(self.shuffler_state)]
            + ["--tokens-file", str(self.tokens_file), "--client-key", str(old_s / "client.key")],
            ["curator", "restore", str(backups / "curator"), "--state-dir", str(self.curator_state)]
            + (["--carry-journal", str(old_c / "ledger.journal")] if (old_c / "ledger.journal").exists() else []),
        ):
            done = _lac(*argv)
            if done.returncode:
                raise RuntimeError(f"lac {' '.join(argv)}: {done.stderr}")
            self.note(done.stdout.strip())
        shutil.rmtree(old_s)  # room on the tmpfs
        del old_tokens
        self.note(f"restored: curator started in {self.curator.start():.1f} s")
        self.note(f"restored: shuffler started in {self.shuffler.start():.1f} s")
        after_s, after_c = shuffler_status(self.shuffler, self.operator), curator_status(self.curator)
        self.restored = {
            "shuffler": (before_s.buffered_reports, before_s.batches_forwarded, dict(before_s.counters))
            == (after_s.buffered_reports, after_s.batches_forwarded, dict(after_s.counters)),
            "curator": (before_c.batches, before_c.reports, before_c.releases)
            == (after_c.batches, after_c.reports, after_c.releases),
        }
        self.note(f"backup/restore: same state {self.restored}")

    # -- the run -----------------------------------------------------------------------------------------------

    def run(self) -> int:
        minutes = self.args.minutes
        self.note(f"soak of {minutes} min starts")
        threads = [self.guarded(f) for f in (self.steady, self.bursty, self.analyst, self.sampler)]
        for t in threads:
            t.start()
        total = minutes * 60.0
        plan = sorted(
            [(f * total, "kill shuffler") for f in (0.13, 0.33, 0.53, 0.73, 0.9)]
            + [(f * total, "kill curator") for f in (0.2, 0.43, 0.8)]
            + [(0.27 * total, "disk full"), (0.62 * total, "backup/restore")]
        )
        started = time.monotonic()
        for at, what in plan:
            time.sleep(max(0.0, at - (time.monotonic() - started)))
            if what == "kill shuffler":
                self.kill(self.shuffler)
            elif what == "kill curator":
                self.kill(self.curator)
            elif what == "disk full":
                self.disk_full(min(45.0, 0.04 * total))
            else:
                self.backup_restore()
        time.sleep(max(0.0, total - (time.monotonic() - started)))
        self.stop_traffic.set()
        for t in threads:
            t.join(600)
        self.note(f"traffic stopped; {len(self.clients.acked)} acknowledged, {len(self.clients.waiting)} not yet")
        return self.finish()

    def drain(self) -> None:
        """Send the unacknowledged reports until acknowledged, then filler reports and flushes until the shuffler
        holds nothing, and wait until the curator has every batch."""
        deadline = time.monotonic() + 600
        while self.clients.waiting and time.monotonic() < deadline:
            self.clients.resend()
            time.sleep(2)
        fillers = iter(self.clients.fillers)
        while time.monotonic() < deadline:
            s = shuffler_status(self.shuffler, self.operator)
            self.note(
                f"draining: {s.buffered_reports} reports of {s.buffered_clients} clients buffered, "
                f"{s.batches_pending} batches pending"
            )
            if s.buffered_reports == 0 and s.batches_pending == 0:
                break
            if s.buffered_reports:  # a release after the commit that makes MIN_BATCH clients takes them all
                for _ in range(max(1, MIN_BATCH - s.buffered_clients)):
                    self.clients.send(next(fillers), *self.reports.take())
            time.sleep(2)

    def finish(self) -> int:
        from lac.analyst import CuratorClient
        from lac.analyst.client import AnalystError, ReleaseInfo, new_request_id

        self.drain()
        with CuratorClient.with_tls(
            self.curator.address, self.pki.client_tls("analyst"), timeout=60, release_timeout=600
        ) as client:  # the data no longer grows: a leak per release would show as growth from one to the next
            for _ in range(FINAL_RELEASES):
                rid = new_request_id()
                self.release_ids.append(rid)
                with contextlib.suppress(AnalystError):
                    client.release(RELEASE_EPSILON, 1e-6, force=True, request_id=rid)
                got = _rss_and_fds(self.curator.lives[-1].pid)
                self.final_rss.append(got[0] if got else 0)
        self.note(f"final releases over the drained data: RSS after each {[r >> 20 for r in self.final_rss]} MiB")
        s = shuffler_status(self.shuffler, self.operator)
        c = curator_status(self.curator)
        checks: list[tuple[str, bool, str]] = []
        db = sqlite3.connect(f"file:{self.curator_state / 'curator.sqlite'}?mode=ro", uri=True)
        stored = {r[0] for r in db.execute("SELECT report_id FROM report_ids")}
        curator_batches = db.execute("SELECT COUNT(*) FROM batches").fetchone()[0]
        db.close()
        acked = self.clients.acked
        lost = acked - stored
        foreign = stored - self.reports.made
        checks.append(
            (
                "0 acknowledged reports lost",
                not lost and not foreign,
                f"{len(acked)} acknowledged, {len(lost)} of them not at the curator; {len(stored)} stored, "
                f"{len(foreign)} not made by this run; {len(self.clients.waiting)} never acknowledged",
            )
        )
        checks.append(
            (
                "0 duplicated",
                c.reports == len(stored),
                f"the curator counts {c.reports} stored reports and {len(stored)} distinct report ids; it dropped "
                f"{c.rejects.get('replayed_report_id', 0)} resent copies; quarantined {c.quarantined}",
            )
        )
        counters = s.counters
        checks.append(
            (
                "every batch ingested once",
                counters.get("batches_released", 0) == counters.get("batches_forwarded", 0) == curator_batches
                and s.batches_dead_letter == 0,
                f"shuffler released {counters.get('batches_released', 0)}, forwarded "
                f"{counters.get('batches_forwarded', 0)}; the curator holds {curator_batches} batches; "
                f"dead letters {s.batches_dead_letter}",
            )
        )
        with CuratorClient.with_tls(
            self.curator.address, self.pki.client_tls("analyst"), timeout=60, release_timeout=300
        ) as client:

            def listed() -> dict[str, ReleaseInfo]:
                replies = client.call("ListReleases", curator_pb2.ListReleasesRequest()).releases
                return {info.request_id: info for info in map(ReleaseInfo.from_proto, replies)}

            returned, unresolved, lost = listed(), {}, {}
            for rid in self.release_ids:  # a request whose answer was lost is sent again: made now if never made
                if rid not in returned:
                    try:
                        returned[rid] = client.release(RELEASE_EPSILON, 1e-6, force=True, request_id=rid)
                    except AnalystError as exc:
                        if rid in self.answered and exc.code == "FAILED_PRECONDITION" and "restored" in exc.details:
                            # made after the backup and before the restore: its record went with the restore,
                            # its charge stays in the ledger (the curator's journal), as it must
                            lost[rid] = self.answered[rid]
                        else:
                            unresolved[rid] = f"{exc.code}: {exc.details[:80]}"
            recorded = len(listed())
            budget = client.budget()
        charged: Counter[int] = Counter()
        for info in [*returned.values(), *lost.values()]:  # every release, matched to the request id that made it
            for w in range(info.first_window, info.last_window + 1):
                charged[w] += info.ledger_epsilon
        spent = {int(row.window): float(row.spent_epsilon) for row in budget.itertuples()}
        worst = max((abs(spent.get(w, 0.0) - charged.get(w, 0.0)) for w in set(spent) | set(charged)), default=0.0)
        checks.append(
            (
                "ledger = the releases returned",
                worst < 1e-9 and len(returned) == recorded and not unresolved,
                f"{len(self.release_ids)} release requests, {len(returned)} releases returned, {recorded} recorded, "
                f"{len(lost)} made between the backup and the restore (record gone, charge kept), "
                f"unresolved {unresolved or 'none'}; largest |ε spent - ε of returned releases| over {len(spent)} "
                f"windows: {worst:.3g}",
            )
        )
        flat, lines = True, []
        for service in (self.curator, self.shuffler):
            for i, life in enumerate(service.lives):
                growth = life.growth()
                if growth is None:
                    lines.append(f"{service.name} #{i + 1}: {len(life.samples)} samples, too short to judge")
                    continue
                rss, fds = growth
                ok = fds <= FD_BOUND and (service is self.curator or rss <= RSS_BOUND)
                flat &= ok
                peak = max(x[1] for x in life.samples) >> 20
                stored = self.stored_during(life)
                lines.append(
                    f"{service.name} #{i + 1} ({life.ended or 'running'}, {life.samples[-1][0] / 60:.1f} min): RSS "
                    f"{rss / 2**20:+.1f} MiB (peak {peak} MiB), fds {fds:+.0f}"
                    + (f"; {stored} reports stored meanwhile" if service is self.curator else "")
                    + ("" if ok else "  OVER")
                )
        leak = self.final_rss[-1] - self.final_rss[2] if len(self.final_rss) > 3 else 0
        flat &= leak <= FINAL_RSS_BOUND
        lines.append(
            f"curator, {len(self.final_rss)} releases over the final data: RSS after each "
            f"{[r >> 20 for r in self.final_rss]} MiB, last - third {leak / 2**20:+.1f} MiB (bound "
            f"{FINAL_RSS_BOUND >> 20} MiB)"
        )
        orphans = self.curator.orphans + self.shuffler.orphans
        checks.append(
            (
                "RSS and open file descriptors flat; no orphan",
                flat and not orphans,
                f"bounds: fds {FD_BOUND} per life, the shuffler's RSS {RSS_BOUND >> 20} MiB per life, the curator's "
                f"{FINAL_RSS_BOUND >> 20} MiB over its final releases; {len(orphans)} processes outlived a SIGKILL"
                "\n    " + "\n    ".join(lines),
            )
        )
        dead, errors = [], Counter()
        for service in (self.curator, self.shuffler):
            import json

            for line in service.workdir.joinpath(f"{service.name}.log").read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if "background task" in record.get("message", ""):
                        dead.append(record["message"])
                    if record.get("level") in ("ERROR", "CRITICAL"):
                        errors[f"{service.name} {record['level']} {record['logger']}: {record['message'][:70]}"] += 1
        serving = self.curator.healthy() and self.shuffler.healthy()
        checks.append(
            (
                "no background task dead",
                not dead and serving and bool(self.disk.get("recovered", not self.tmpfs)) and not self.crashes,
                f"{len(dead)} background task failures logged; both SERVING at the end: {serving}; disk-full "
                f"episode: {self.disk or 'skipped'}; the soak's own threads failed {len(self.crashes)} times "
                f"{self.crashes[:3]}",
            )
        )
        checks.append(("backup/restore gave the same state", all(self.restored.values()), str(self.restored)))

        with open(self.root / "samples.csv", "w") as f:  # for a closer look at a life
            f.write("service,life,seconds,rss_bytes,fds\n")
            for service in (self.curator, self.shuffler):
                for i, life in enumerate(service.lives):
                    f.writelines(f"{service.name},{i + 1},{t:.0f},{rss},{fds}\n" for t, rss, fds in life.samples)
        print()
        print(f"== soak: {self.args.minutes} min, {self.args.clients} clients, load {load()} at the end ==")
        for what, ok, detail in checks:
            print(f"{'PASS' if ok else 'FAIL'}  {what}: {detail}")
        print(
            f"traffic: {len(self.reports.made)} reports made, {len(acked)} acknowledged; client errors "
            f"{dict(self.clients.errors)}; releases {self.releases_ok} ok at once, errors {dict(self.release_errors)}; "
            f"exports (window, rows) {self.exports}, errors {dict(self.export_errors)}"
        )
        print("ERROR/CRITICAL log records: " + (", ".join(f"{k} x{n}" for k, n in errors.most_common()) or "none"))
        return 0 if all(ok for _, ok, _ in checks) else 1

    def close(self) -> None:
        self.stop_traffic.set()
        for service in (self.shuffler, self.curator):
            with contextlib.suppress(Exception):
                if service.service is not None and service.service.process.poll() is None:
                    service.stop()
        if getattr(self, "tmpfs", False):
            subprocess.run(["umount", str(self.fs)], check=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long the traffic runs [default: 30]")
    p.add_argument("--dir", default=None, help="where the state goes [default: a new temporary directory]")
    p.add_argument("--clients", type=int, default=3000, help="simulated clients [default: 3000]")
    p.add_argument("--rate", type=float, default=4.0, help="steady reports per second [default: 4]")
    p.add_argument("--burst", type=int, default=200, help="reports per burst [default: 200]")
    p.add_argument("--burst-every", type=float, default=150.0, help="seconds between bursts [default: 150]")
    p.add_argument("--release-every", type=float, default=60.0, help="seconds between releases [default: 60]")
    p.add_argument("--export-every", type=float, default=300.0, help="seconds between exports [default: 300]")
    p.add_argument("--tmpfs-mib", type=int, default=160, help="size of the shuffler's tmpfs [default: 160]")
    p.add_argument("--seed", type=int, default=0, help="order of the texts [default: 0]")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    soak = Soak(args)
    try:
        soak.setup()
        return soak.run()
    finally:
        soak.close()


if __name__ == "__main__":
    sys.exit(main())
