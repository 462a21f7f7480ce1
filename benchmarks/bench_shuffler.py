#!/usr/bin/env python3
"""Shuffler throughput: durable ingest (group commit) and shuffle + forward of a large batch.

1. Sustained ingest into a real shuffler process (auth none, nothing released meanwhile) with
   batched RPCs of --per-rpc reports, and with one-report unary RPCs; payloads of --payload-bytes
   (560 = the smallest HPKE-sealed report). Every ACK means the reports were fsync'd.
   Baseline in the same run: one fsync'd transaction per RPC (no group commit), via the library.
2. Release (read the buffer's keys, CSPRNG permutation, store the batches) + forward (read the payloads in
   shuffled order, send to a real gRPC CuratorIngest sink, mark delivered) of --batch-reports reports,
   cut into batches of at most --max-batch-bytes; baseline: random.SystemRandom().shuffle of the same list.
   Only the ReportLog API is used, so the same script times an older shuffler (PYTHONPATH).

    python benchmarks/bench_shuffler.py [--seconds 8] [--per-rpc 100] [--batch-reports 1000000]
        [--batch-payload-bytes 32] [--max-batch-bytes N] [--only-release]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from lac.common import envelope
from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2
from lac.shuffler.reportlog import ReportLog
from lac.shuffler.wire import varint as _varint
from lac.suite import procs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # lac_testkit


def _payload_field(size: int) -> bytes:
    """An HPKE-shaped payload (valid key id and padded size; random bytes, the shuffler cannot tell)."""
    size = min(n for n in envelope.SEALED_SIZES if n >= size)
    p = reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="0" * envelope.KEY_ID_CHARS, data=os.urandom(size))
    body = p.SerializeToString()
    return b"\x12" + _varint(len(body)) + body  # ClientReport.payload = 2


def _request(per_rpc: int, payload_field: bytes) -> bytes:
    """A serialized SubmitRequest of ``per_rpc`` reports with fresh idempotency ids."""
    parts = []
    for _ in range(per_rpc):
        report = b"\x0a\x10" + os.urandom(16) + payload_field  # ClientReport.idempotency_id = 1
        parts.append(b"\x0a" + _varint(len(report)) + report)  # SubmitRequest.reports = 1
    return b"".join(parts)


async def _load(address: str, per_rpc: int, seconds: float, concurrency: int, payload_field: bytes) -> float:
    """Reports acknowledged per second over ``seconds`` with ``concurrency`` calls in flight."""
    done = 0
    async with grpc.aio.insecure_channel(address) as ch:
        submit = ch.unary_unary(
            "/lac.v1.Shuffler/Submit",
            request_serializer=None,
            response_deserializer=shuffler_pb2.SubmitResponse.FromString,
        )
        await submit(_request(per_rpc, payload_field), timeout=30)  # warm up
        end = time.perf_counter() + seconds

        async def worker():
            nonlocal done
            while time.perf_counter() < end:
                reply = await submit(_request(per_rpc, payload_field), timeout=30)
                done += len(reply.acks)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve_without_group_commit(argv: list[str]) -> None:
    """Baseline server: the same shuffler, but every call gets its own fsync'd transaction."""
    orig = ReportLog.append_groups

    def one_transaction_per_call(self, groups, *args):
        return [orig(self, [g], *args)[0] for g in groups]

    ReportLog.append_groups = one_transaction_per_call
    from lac.common.cli import main as lac_main

    sys.exit(lac_main(["shuffler", "serve", *argv]))


def _start(tmp: Path, name: str, args: list[str], naive: bool):
    if not naive:
        return procs.start("shuffler", args, tmp / name)
    port_file = tmp / name / "port"
    port_file.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp / name / "log", "ab") as log:  # the child has its own copy of the descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-without-group-commit",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"baseline server exited; see {tmp / name / 'log'}")
        time.sleep(0.05)
    return procs.Service("shuffler-naive", proc, int(port_file.read_text()), tmp / name / "log")


def _release_and_forward(
    tmp: Path, n: int, size: int, max_batch_bytes: int
) -> tuple[float, float, float, float, int, float, float]:
    """Release ``n`` buffered reports of ``size`` bytes (cut into batches of at most ``max_batch_bytes``) and
    forward every batch, one after the other, to a real gRPC sink, each marked delivered once acknowledged.
    Seconds of the release, of the forwarding, of a SystemRandom shuffle of n items; MB sent; batches; CPU
    seconds of this process (the sink's threads included) in the release and in the forwarding."""
    from lac_testkit import Sink  # the tests' real gRPC CuratorIngest sink

    log = ReportLog(tmp / "big")
    payload = reports_pb2.SealedPayload(
        encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE, data=os.urandom(size)
    ).SerializeToString()
    for i in range(0, n, 100_000):
        log.append_groups(
            [([(os.urandom(16), None, payload) for _ in range(min(100_000, n - i))], None)], 0, 0, 1 << 40
        )
    t0, c0 = time.perf_counter(), time.process_time()
    log.release(n, max_batch_bytes=max_batch_bytes)
    t_release, cpu_release = time.perf_counter() - t0, time.process_time() - c0
    sink = Sink()
    sent = forwarded = 0
    try:
        with grpc.insecure_channel(sink.address, options=[("grpc.max_send_message_length", 1 << 30)]) as ch:
            ingest = ch.unary_unary(
                "/lac.v1.CuratorIngest/IngestBatch",
                request_serializer=None,
                response_deserializer=curator_pb2.IngestBatchResponse.FromString,
            )
            t1, c1 = time.perf_counter(), time.process_time()
            batches = log.pending_batches()
            for batch_id in batches:  # as the forwarder does: build the request, send it, mark it delivered
                body = log.batch(batch_id).body
                reply = ingest(body, timeout=300)
                log.delivered(batch_id)
                sent += len(body)
                forwarded += reply.accepted
                sink.raw.clear()
            t_forward, cpu_forward = time.perf_counter() - t1, time.process_time() - c1
        assert forwarded == n and log.buffered() == 0
    finally:
        sink.stop()
        log.close()
    items = list(range(n))
    t2 = time.perf_counter()
    random.SystemRandom().shuffle(items)
    t_naive = time.perf_counter() - t2
    return t_release, t_forward, t_naive, sent / 1e6, len(batches), cpu_release, cpu_forward


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-without-group-commit":
        return _serve_without_group_commit(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each ingest measurement")
    ap.add_argument("--per-rpc", type=int, default=100, help="reports per batched RPC")
    ap.add_argument("--concurrency", type=int, default=32, help="RPCs in flight")
    ap.add_argument("--payload-bytes", type=int, default=560, help="sealed payload size (560 = smallest HPKE)")
    ap.add_argument("--batch-reports", type=int, default=1_000_000, help="size of the shuffled batch")
    ap.add_argument(
        "--batch-payload-bytes",
        type=int,
        default=32,
        help="payload size in the big batch (1M x 32 B fits one 64 MiB gRPC message)",
    )
    ap.add_argument(
        "--max-batch-bytes",
        type=int,
        default=1 << 62,
        help="cut the release into batches of at most this many bytes (the shuffler's max_batch_bytes; default: "
        "one batch); e.g. 62914560 (60 MiB, the service's default) with --batch-payload-bytes 560",
    )
    ap.add_argument("--only-release", action="store_true", help="skip the ingest measurements")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="lac-bench-shuffler-") as d:
        tmp = Path(d)
        field = _payload_field(a.payload_bytes)
        args = [
            "--curator",
            "127.0.0.1:1",
            "--auth",
            "none",
            "--insecure",
            "--min-batch",
            str(10**9),
            "--max-reports-per-request",
            str(max(100, a.per_rpc)),
        ]
        rates = {}
        for name, naive in () if a.only_release else (("grouped", False), ("naive", True)):
            shuffler = _start(tmp, name, ["--state-dir", str(tmp / name / "state"), *args], naive)
            try:
                cpu0 = _cpu_seconds(shuffler.process.pid)
                batched = asyncio.run(_load(shuffler.address, a.per_rpc, a.seconds, a.concurrency, field))
                cpu = _cpu_seconds(shuffler.process.pid) - cpu0
                unary = asyncio.run(_load(shuffler.address, 1, a.seconds, 2 * a.concurrency, field))
            finally:
                shuffler.stop()
            rates[name] = (batched, cpu, unary)
        if rates:
            batched, cpu_batched, unary = rates["grouped"]
            print(
                f"ingest, RPCs of {a.per_rpc} x {a.payload_bytes} B, {a.concurrency} in flight: "
                f"{batched:,.0f} reports/s durable (target >= 20,000); shuffler process CPU "
                f"{cpu_batched / (batched * a.seconds) * 1e6:.0f} us/report "
                f"(=> {batched * a.seconds / cpu_batched:,.0f} reports per CPU-second)"
            )
            nb, _, nu = rates["naive"]
            print(
                f"  baseline, same server with one fsync'd transaction per call (no group commit): "
                f"{nb:,.0f} reports/s -> x{batched / nb:.1f}"
            )
            print(
                f"ingest, unary one-report RPCs, {2 * a.concurrency} in flight: {unary:,.0f} reports/s "
                f"(x{batched / unary:.1f} slower than batched); without group commit {nu:,.0f} reports/s "
                f"-> x{unary / nu:.1f}"
            )
        t_rel, t_fwd, t_naive, mb, parts, cpu_rel, cpu_fwd = _release_and_forward(
            tmp, a.batch_reports, a.batch_payload_bytes, a.max_batch_bytes
        )
        print(
            f"release of {a.batch_reports:,} reports of {a.batch_payload_bytes} B (read the buffer, CSPRNG "
            f"permutation, store the batches): {t_rel:.2f}s; forward {mb:.0f} MB in {parts} batch(es) to a gRPC "
            f"sink, each marked delivered: {t_fwd:.2f}s; total {t_rel + t_fwd:.2f}s (target <= 5 s for 1M x 32 B); "
            f"CPU of this process (sink included): release {cpu_rel:.2f}s, forward {cpu_fwd:.2f}s"
        )
        print(f"  baseline: random.SystemRandom().shuffle of {a.batch_reports:,} items alone: {t_naive:.2f}s")


if __name__ == "__main__":
    main()
