#!/usr/bin/env python3
"""One epoch as one run: sealed reports -> shuffler ingest over gRPC -> shuffle and forward -> curator
ingest on every core -> the default release; each stage timed, and the whole.

    python benchmarks/bench_epoch.py [--users 1000000 | --quick] [--per-call 100] [--in-flight 16] [--keep DIR]
                                     [--release-workers 1] [--forward-in-flight 2] [--batches 1]

Reports: one per user, real short texts (the simulated users' texts, ``benchkit.real_reports``), words NOT
perturbed (no Localizer runs here: the pipeline's speed does not depend on which words), HPKE-sealed to the
curator's key by the SDK's envelope before the clock starts (pre-generated on every core, as the users'
devices would). So the content is realistic in size and n-gram spread, but it is not what a deployment's
devices would send after perturbation: a speed benchmark only.

Services: real ``lac shuffler serve`` and ``lac curator serve`` processes on loopback with **TLS off**
(``--insecure``, as in ``bench_load.py`` and ``bench_shuffler.py``: the payloads are still HPKE-sealed to the
curator's key ring and opened by it; TLS would add AES-GCM over the ~600 MB once per hop). The shuffler runs
``--auth none``: one report per client cannot be enforced without N tokens and N one-report calls (~1,200-1,600
calls/s in ``bench_load.py``, so 10+ minutes for 1M users), so the load generator sends ``--per-call`` reports
per Submit, ``--in-flight`` calls at a time, as a gateway batching its devices would; the curator accepts such
batches (not bound to distinct clients) only because it too runs ``--insecure``. The shuffler releases when
``--min-batch`` = N reports are committed, as at the end of an epoch. With ``--batches K`` > 1 it runs
``--min-batch N/K --keep-reserve`` instead: batches of about N/K are released and forwarded while the ingest goes
on (the curator ingesting meanwhile), and the operator's ``Flush`` at the end of the ingest releases the reserve;
every report is then amplified among at least N/K reports instead of N (the ε either would give is printed).
The curator ingests with ``--ingest-workers`` = every core
(its pool started with the server) and keeps its channel in the data dir's cache (sampled before the clock).

Stages (wall clock; the services' GetStatus polled from this process, the curator's every 0.1 s, the
shuffler's once its ingest ended):
1. ingest: first Submit -> every report acknowledged (fsync'd) by the shuffler;
2. shuffle: -> the whole release cut into shuffled batches (the shuffler's buffer empty; with ``--batches``, the
   last one, after the Flush);
3. forward + curator ingest: -> the curator holds every report (opened, validated, counted, stored); the
   shuffler forwards batch after batch, so this overlaps the curator's work with the forwarding;
4. release: the default release (posterior, ε = 1, δ = 1e-6, sound sensitivity) by an analyst.
With each stage: the CPU seconds of the shuffler, the curator (its ingest workers included) and this load
generator, from /proc; the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from benchkit import cpu_seconds, load, real_reports, sealed_payloads

from lac.analyst import CuratorClient, Unavailable
from lac.common import envelope
from lac.common.paths import data_dir
from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.amplification import shuffle_epsilon
from lac.shuffler.auth import add_clients
from lac.suite import procs
from lac.suite.data import prepare_corpora

SUBMIT = "/lac.v1.Shuffler/Submit"


def requests(payloads: list[bytes], per_call: int) -> list[bytes]:
    """Serialized SubmitRequests of ``per_call`` sealed reports each, with fresh idempotency ids."""
    out = []
    for i in range(0, len(payloads), per_call):
        reports = [
            shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=None) for _ in payloads[i : i + per_call]
        ]
        request = shuffler_pb2.SubmitRequest(reports=reports)
        for r, raw in zip(request.reports, payloads[i : i + per_call]):
            r.payload.ParseFromString(raw)
        out.append(request.SerializeToString())
    return out


async def submit_all(address: str, bodies: list[bytes], in_flight: int) -> int:
    """Send every request, ``in_flight`` at a time over a few channels; the reports acknowledged."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
    acked = 0
    todo = iter(bodies)

    async def worker(channel: grpc.aio.Channel) -> None:
        nonlocal acked
        submit = channel.unary_unary(
            SUBMIT, request_serializer=None, response_deserializer=shuffler_pb2.SubmitResponse.FromString
        )
        for body in todo:
            while True:
                try:
                    reply = await submit(body, timeout=120, wait_for_ready=True)
                    break
                except grpc.aio.AioRpcError as exc:  # the commit queue full: UNAVAILABLE, retry-after
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    await asyncio.sleep(0.1)
            acked += sum(a.status == shuffler_pb2.ACK_STATUS_STORED for a in reply.acks)

    try:
        await asyncio.gather(*(worker(channels[i % len(channels)]) for i in range(in_flight)))
    finally:
        for c in channels:
            await c.close()
    return acked


class Watch:
    """Polls both services' GetStatus every 50 ms in a thread; records when each stage ended."""

    def __init__(self, shuffler, curator, n: int, operator_token: str) -> None:
        self.n = n
        self.operator = (("authorization", f"Bearer {operator_token}"),)
        self.shuffler_channel = grpc.insecure_channel(shuffler.address)
        self.shuffler = shuffler_pb2_grpc.ShufflerStub(self.shuffler_channel)
        self.curator = CuratorClient(curator.address, insecure=True)  # the operator's view (insecure curator)
        self.shuffled_at: float | None = None
        self.stored_at: float | None = None
        self.batches = 0
        self.ingested = threading.Event()  # set by the load generator when every report is acknowledged
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self._poll()
        except BaseException as exc:  # said by wait()
            self.failure = exc

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self.ingested.is_set() and self.shuffled_at is None:  # not before: GetStatus reads the whole buffer
                try:
                    s = self.shuffler.GetStatus(
                        shuffler_pb2.ShufflerStatusRequest(), timeout=60, metadata=self.operator
                    )
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                        raise
                else:
                    if s.buffered_reports == 0 and s.counters.get("accepted", 0) >= self.n:
                        self.shuffled_at = time.perf_counter()
                        self.batches = s.batches_pending + s.batches_forwarded
            try:
                c = self.curator.call("GetStatus", curator_pb2.CuratorStatusRequest(), timeout=60)
            except Unavailable:  # UNAVAILABLE or DEADLINE_EXCEEDED
                continue
            if c.reports + sum(c.rejects.values()) >= self.n:
                self.stored_at = time.perf_counter()
                self.curator_status = c
                return
            time.sleep(0.1)

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            raise TimeoutError(f"the curator did not hold all {self.n:,} reports within {timeout:g} s")
        if self.failure is not None:
            raise RuntimeError("polling the services' status failed") from self.failure

    def close(self) -> None:
        self._stop.set()
        self.shuffler_channel.close()
        self.curator.close()


def _pids(service) -> list[int]:
    """The service's process and its descendants (the curator's ingest workers, forkserver)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    found, todo = [service.process.pid], [service.process.pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cpu(service) -> float:
    try:
        return cpu_seconds(_pids(service), own=False)
    except OSError:  # a worker ended meanwhile
        return cpu_seconds([service.process.pid], own=False)


def _wait_for_channel(curator, timeout: float = 600.0) -> str:
    """Wait until the curator has its local channel (read from the cache or sampled) or said it has none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = curator.log_path.read_text(errors="replace")
        if "local channel ready" in text:
            return "ready"
        if "no local channel" in text:
            return "none (releases describe the perturbed text)"
        time.sleep(0.2)
    raise TimeoutError("the curator's local channel was not ready in time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000, help="users, one report each")
    ap.add_argument("--quick", action="store_true", help="100,000 users")
    ap.add_argument("--per-call", type=int, default=100, help="reports per Submit")
    ap.add_argument("--in-flight", type=int, default=16, help="Submit calls in flight")
    ap.add_argument("--keep", type=Path, default=None, help="keep the services' state and logs under this directory")
    ap.add_argument(
        "--release-workers", type=int, default=1, help="the curator's release_workers (processes reading segments)"
    )
    ap.add_argument("--forward-in-flight", type=int, default=2, help="the shuffler's batches in flight to the curator")
    ap.add_argument(
        "--batches",
        type=int,
        default=1,
        help="K > 1: release batches of N/K during the ingest (min_batch N/K, keep_reserve) and Flush at its end",
    )
    a = ap.parse_args()
    n = 100_000 if a.quick else a.users
    cores = len(os.sched_getaffinity(0))
    load_before = load()
    print(
        f"machine: {cores} cores ({platform.machine()}), Python {platform.python_version()}, grpcio "
        f"{grpc.__version__}; load average before: {load_before}; {n:,} users, one report each; curator "
        f"release_workers {a.release_workers}, shuffler forward_in_flight {a.forward_in_flight}, "
        f"{'one batch' if a.batches <= 1 else f'batches of ≥ {n // a.batches:,} during the ingest (keep_reserve)'}",
        flush=True,
    )
    if a.keep is not None:
        a.keep.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        if a.keep is None:
            work = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="lac-bench-epoch-")))
        else:
            work = Path(tempfile.mkdtemp(prefix="lac-bench-epoch-", dir=a.keep))
        keys = work / "curator-keys"
        envelope.generate_key(keys)
        t0 = time.perf_counter()
        texts = real_reports(n)
        payloads = sealed_payloads(texts, envelope.CuratorKeyRing.load(keys).public_key(), workers=cores)
        bodies = requests(payloads, a.per_call)
        n_words = sum(len(s) for r in texts for s in r)
        size = sum(map(len, payloads))
        del texts
        print(
            f"pre-generated (not timed): {n:,} sealed reports ({n_words / n:.1f} words, {size / n:.0f} B sealed on "
            f"average; {size / 1e6:,.0f} MB), {len(bodies):,} Submit requests of {a.per_call}, in "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        del payloads
        curator = procs.start(
            "curator",
            [
                "--state-dir",
                str(work / "curator"),
                "--public-corpus",
                str(prepare_corpora().public_corpus),
                "--channel-cache-dir",
                str(data_dir() / "channels"),
                "--ingest-workers",
                str(cores),
                "--release-workers",
                str(a.release_workers),
                "--key-dir",
                str(keys),
                "--insecure",
            ],
            work,
        )
        shuffler = None
        try:
            channel = _wait_for_channel(curator)
            (operator,) = add_clients(work / "shuffler" / "clients.tokens", ["bench-operator"], role="operator")
            shuffler = procs.start(
                "shuffler",
                [
                    "--state-dir",
                    str(work / "shuffler"),
                    "--curator",
                    curator.address,
                    "--auth",
                    "none",
                    "--min-batch",
                    str(n // max(1, a.batches)),
                    *(["--keep-reserve"] if a.batches > 1 else []),
                    "--forward-in-flight",
                    str(a.forward_in_flight),
                    "--max-reports-per-request",
                    str(max(100, a.per_call)),
                    "--insecure",
                ],
                work,
            )
            watch = Watch(shuffler, curator, n, operator)
            while True:  # the shuffler has the curator's deployment (else its Submit answers UNAVAILABLE)
                try:
                    eps0 = watch.shuffler.GetDeployment(reports_pb2.DeploymentRequest(), timeout=10).report_epsilon0
                    break
                except grpc.RpcError:
                    time.sleep(0.2)
            print(f"services up (curator's local channel: {channel}); load average {load()}", flush=True)
            cpu0 = (_cpu(shuffler), _cpu(curator), time.process_time())
            watch.start()
            start = time.perf_counter()
            acked = asyncio.run(submit_all(shuffler.address, bodies, a.in_flight))
            ingested = time.perf_counter()
            if a.batches > 1:  # the epoch's end: the operator releases the reserve
                flushed = watch.shuffler.Flush(shuffler_pb2.FlushRequest(), timeout=600, metadata=watch.operator)
                assert flushed.released, flushed.note
            watch.ingested.set()
            cpu1 = (_cpu(shuffler), _cpu(curator), time.process_time())
            watch.wait(timeout=3600)
            cpu2 = (_cpu(shuffler), _cpu(curator), time.process_time())
            shuffled = watch.shuffled_at or ingested
            stored = watch.stored_at or time.perf_counter()
            with CuratorClient(curator.address, insecure=True, release_timeout=3600) as analyst:
                r0 = time.perf_counter()
                record = analyst.release(1.0, 1e-6)
                released = time.perf_counter()
            cpu3 = (_cpu(shuffler), _cpu(curator), time.process_time())
            status = watch.curator_status
            watch.close()
        finally:
            if shuffler is not None:
                shuffler.stop()
            curator.stop()
    assert acked == n, (acked, n)
    stages = [
        ("1. shuffler ingest over gRPC (fsync'd acks)", start, ingested, cpu0, cpu1),
        ("2. shuffle (release cut into batches)", ingested, shuffled, None, None),
        ("3. forward + curator ingest (every core)", shuffled, stored, None, None),
        ("2+3. shuffle, forward, curator ingest", ingested, stored, cpu1, cpu2),
        ("4. default release (posterior, ε = 1)", r0, released, cpu2, cpu3),
    ]
    total = released - start
    print()
    print("| stage | seconds | µs per report | shuffler CPU s | curator CPU s | load generator CPU s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, t_a, t_b, c_a, c_b in stages:
        cpu = " | ".join(f"{b - a:.1f}" for a, b in zip(c_a, c_b)) if c_a else " |  | "
        print(f"| {name} | {t_b - t_a:.1f} | {1e6 * (t_b - t_a) / n:.0f} | {cpu} |")
    whole = " | ".join(f"{b - a:.1f}" for a, b in zip(cpu0, cpu3))
    print(f"| **whole epoch** | **{total:.1f}** | {1e6 * total / n:.0f} | {whole} |")
    print()
    print(
        f"{n:,} reports stored by the curator in {status.batches} batch(es) ({watch.batches} released by the "
        f"shuffler), {sum(status.rejects.values())} rejected; release {record.release_id} "
        f"({record.mechanism}, σ = {record.sigma:.4g}); target ≤ 90 s for 1M users on 2 cores; "
        f"load average after: {load()} (before: {load_before}); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    floor = n // max(1, a.batches)
    at = {m: shuffle_epsilon(eps0, m, 1e-6).epsilon for m in (floor, n)}
    last = f"; the Flush released the last {flushed.batch_size:,}" if a.batches > 1 else ""
    print(
        f"every release held ≥ {floor:,} reports (min_batch){last}. Had the clients been authenticated (--auth none "
        f"here: no amplification is claimed), the deployment's ε0 = {eps0:.4g} would amplify to ε = {at[floor]:.4g} "
        f"at n = {floor:,} and to {at[n]:.4g} at n = {n:,} (δ = 1e-6)"
    )


if __name__ == "__main__":
    sys.exit(main())
