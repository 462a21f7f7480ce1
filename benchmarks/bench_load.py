#!/usr/bin/env python3
"""Shuffler under load: many concurrent clients, each with its own bearer token and connection.

A real ``lac shuffler serve`` process (a fresh state directory per run) with TLS OFF (``--insecure``:
plaintext gRPC, so the numbers exclude TLS) and token authentication ON (every call carries its
client's ``authorization: Bearer`` header, checked against the tokens file). Clients are asyncio
gRPC channels in one load process, one unary Submit in flight per client, HPKE-shaped 560-byte
payloads (the smallest sealed report); every acknowledgement means the reports were fsync'd.
Nothing is released meanwhile (min_batch is out of reach, the quota is lifted), so this measures
authenticated durable ingest.

Runs: the baseline (1 client, 1 report per call, sequential), 50 and 200 clients with 1 report per
call, and 50 and 200 clients with 100 reports per call. For each: reports/s, p50/p99 call latency,
errors by status code, and ratios to the baseline of the same invocation.

    python benchmarks/bench_load.py [--seconds 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from lac.common import envelope
from lac.common.v1 import reports_pb2
from lac.shuffler.auth import add_clients
from lac.shuffler.wire import varint as _varint
from lac.suite import procs

SUBMIT = "/lac.v1.Shuffler/Submit"


def payload_field(size: int = 560) -> bytes:
    """ClientReport.payload: an HPKE-shaped sealed payload (valid key id and padded size, random bytes)."""
    size = min(n for n in envelope.SEALED_SIZES if n >= size)
    p = reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="0" * envelope.KEY_ID_CHARS, data=os.urandom(size))
    body = p.SerializeToString()
    return b"\x12" + _varint(len(body)) + body


def _request(per_call: int, payload: bytes) -> bytes:
    """A serialized SubmitRequest of ``per_call`` reports with fresh idempotency ids."""
    parts = []
    for _ in range(per_call):
        report = b"\x0a\x10" + os.urandom(16) + payload
        parts.append(b"\x0a" + _varint(len(report)) + report)
    return b"".join(parts)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    clients: int
    per_call: int
    seconds: float
    reports: int
    calls: int
    reports_per_s: float
    p50_ms: float
    p99_ms: float
    errors: dict = field(default_factory=dict)
    server_cpu: float = 0.0  # server CPU seconds per wall second (2.0 = both cores of this machine)
    load_cpu: float = 0.0  # the load generator's, likewise


async def drive(
    addresses: list[str],
    tokens: list[str],
    per_call: int,
    seconds: float,
    payload: bytes,
    credentials: grpc.ChannelCredentials | None = None,
):
    """Each client: its own channel (own connection) and token, one call in flight, for ``seconds``; client i
    calls ``addresses[i % len(addresses)]``, over TLS with ``credentials`` (plaintext without)."""
    own = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.secure_channel(addresses[i % len(addresses)], credentials, options=own)
        if credentials
        else grpc.aio.insecure_channel(addresses[i % len(addresses)], options=own)
        for i in range(len(tokens))
    ]
    latencies: list[float] = []
    errors: Counter = Counter()
    done = 0
    start = asyncio.Event()
    ready = 0

    async def client(channel, token):
        nonlocal done, ready
        submit = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
        md = (("authorization", f"Bearer {token}"),)
        await submit(_request(per_call, payload), metadata=md, timeout=60)  # connect + warm up
        ready += 1
        if ready == len(tokens):  # every client connected: the clock starts for all at once
            t_start[0] = time.perf_counter()
            start.set()
        await start.wait()
        end = t_start[0] + seconds
        while time.perf_counter() < end:
            req = _request(per_call, payload)
            t0 = time.perf_counter()
            try:
                await submit(req, metadata=md, timeout=60)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            done += per_call

    t_start = [0.0]
    try:
        await asyncio.gather(*(client(c, t) for c, t in zip(channels, tokens)))
        wall = time.perf_counter() - t_start[0]
    finally:
        for c in channels:
            await c.close()
    return done, latencies, errors, wall


def run(name: str, tmp: Path, tokens_file_lines: Path, tokens: list[str], per_call: int, seconds: float) -> Result:
    state = tmp / name / "state"
    state.mkdir(parents=True)
    (state / "clients.tokens").write_bytes(tokens_file_lines.read_bytes())
    os.chmod(state / "clients.tokens", 0o600)
    args = [
        "--state-dir",
        str(state),
        "--curator",
        "127.0.0.1:1",
        "--insecure",
        "--auth",
        "token",
        "--min-batch",
        "1000000000",
        "--reports-per-window",
        "1000000000",
    ]
    service = procs.start("shuffler", args, tmp / name)
    try:
        payload = payload_field()
        cpu0, lcpu0, t0 = _cpu_seconds(service.process.pid), time.process_time(), time.perf_counter()
        done, lat, errors, wall = asyncio.run(drive([service.address], tokens, per_call, seconds, payload))
        cpu1, lcpu1, t1 = _cpu_seconds(service.process.pid), time.process_time(), time.perf_counter()
    finally:
        service.stop()
    lat.sort()
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [lat[0]] * 99
    return Result(
        name,
        len(tokens),
        per_call,
        wall,
        done,
        len(lat),
        done / wall,
        q[49] * 1e3,
        q[98] * 1e3,
        dict(errors),
        (cpu1 - cpu0) / (t1 - t0),
        (lcpu1 - lcpu0) / (t1 - t0),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="measured duration of each run")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lac-bench-load-") as d:
        tmp = Path(d)
        tokens_file = tmp / "clients.tokens"
        tokens = add_clients(tokens_file, [f"load-{i}" for i in range(200)])
        plan = [
            ("baseline: 1 client, 1 report/call", 1, 1),
            ("50 clients, 1 report/call", 50, 1),
            ("200 clients, 1 report/call", 200, 1),
            ("50 clients, 100 reports/call", 50, 100),
            ("200 clients, 100 reports/call", 200, 100),
        ]
        results = []
        for i, (name, n, per_call) in enumerate(plan):
            r = run(f"run{i}", tmp, tokens_file, tokens[:n], per_call, a.seconds)
            r.name = name
            results.append(r)
            print(f"  {name}: {r.reports_per_s:,.0f} reports/s", file=sys.stderr)
    load_after = os.getloadavg()
    base = results[0]
    print(
        f"machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}; load average before "
        f"{load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, after "
        f"{load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; TLS off (--insecure), tokens on"
    )
    print()
    print(
        "| run | reports/s | x baseline | calls/s | p50 ms | p99 ms | p50 x baseline | errors | server CPU | load CPU |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for r in results:
        errs = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "none"
        print(
            f"| {r.name} | {r.reports_per_s:,.0f} | {r.reports_per_s / base.reports_per_s:.1f} | "
            f"{r.calls / r.seconds:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.p50_ms / base.p50_ms:.1f} | "
            f"{errs} | {r.server_cpu:.2f} | {r.load_cpu:.2f} |"
        )
    if a.json:
        a.json.write_text(
            json.dumps(
                {"load_before": load_before, "load_after": load_after, "results": [asdict(r) for r in results]},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
