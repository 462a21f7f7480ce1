#!/usr/bin/env python3
"""High availability (issue 35 item 6), each part against a baseline measured in the same run, on a private
PostgreSQL cluster on this machine (``lac.common.pgcluster``, fsync on like SQLite's ``synchronous=FULL``):

(a) Submit throughput of one shuffler over SQLite (the baseline) and of 1, 2 and 3 replicas over one PostgreSQL
    database: the same load generator (``bench_load.drive``: ``--clients`` clients, each its own token and TLS
    connection, spread over the replicas, one Submit of ``--per-call`` HPKE-shaped 560-byte reports in flight each),
    TLS and tokens as deployed, ``--seconds`` each. Nothing is released meanwhile (min_batch out of reach): this is
    authenticated durable Submit. Every process shares the machine's cores with the others and the generator.
(b) Failover time: 3 replicas over PostgreSQL, ``--failover-clients`` SDK clients (``ShufflerClient``, the three
    addresses, the victim first) each submitting one report per call in a loop; SIGKILL the victim and time, per
    client, from the kill to its next acknowledged Submit (``--trials`` trials, a different victim each, restarted
    after); then ``--freeze-trials`` with the victim frozen (SIGSTOP, as a hung machine: its connections stay open
    and nothing answers; SIGCONT after ``--after-freeze`` s). The SDK's defaults (a call's deadline 30 s). Nothing
    lost: the reports the database accepted equal the distinct reports acknowledged.
(c) A release over 1,000,000 stored reports by a curator on PostgreSQL against one on SQLite: SYNTHETIC reports (a
    speed benchmark, not language: each of 100 batches of 10,000 reports holds ~Poisson(10) distinct n-grams of the
    public prior drawn Zipf-like, stored with ``CuratorStore.add_batch`` as ingest stores them), then the same
    release (posterior, ε = 0.1, forced) asked over gRPC of each curator ``--releases`` times, alternating.

    python benchmarks/bench_ha.py [--seconds 8] [--clients 60] [--per-call 10] [--trials 5] [--releases 3]
        [--only submit,failover,release]

Prints each figure with the load average beside it and the ratios against the baseline. Needs Debian's postgresql
package (scripts/os_packages.sh postgresql) and ``lac data``'s public corpus for (c).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import drive, payload_field
from benchkit import load

from lac.common import envelope
from lac.common.pgcluster import PostgresCluster
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2
from lac.shuffler.auth import add_clients
from lac.shuffler.reportlog import KEY_FILE, write_key
from lac.suite import procs

QUOTA = 10**9  # no client reaches its quota: (a) and (b) measure Submit, not refusals


def replicas(root: Path, n: int, store: str, tokens_file: Path, keys: procs.LocalDeployment) -> list[procs.Service]:
    """``n`` ``lac shuffler serve`` processes with TLS over ``store`` ("" = SQLite in each state directory), each
    state directory holding the same client key and tokens; nothing is released (min_batch out of reach)."""
    client_key = os.urandom(32)
    started: list[procs.Service] = []
    try:
        for i in range(n):
            state = root / f"state{i}"
            state.mkdir(parents=True, mode=0o700)
            write_key(state / KEY_FILE, client_key)
            (state / "clients.tokens").write_bytes(tokens_file.read_bytes())
            (state / "clients.tokens").chmod(0o600)
            args = ["--state-dir", str(state), "--curator", "127.0.0.1:1", "--min-batch", str(QUOTA),
                    "--reports-per-window", str(QUOTA), *keys.shuffler_args()]  # fmt: skip
            if store:
                args += ["--store", store]
            started.append(procs.start("shuffler", args, root / f"proc{i}", tls=keys.client_tls()))
    except BaseException:
        for s in started:
            s.stop()
        raise
    return started


def conflicts(cluster: PostgresCluster) -> int:
    """Serialization failures the server has logged so far: transactions a service rolled back and ran again."""
    return cluster.log.read_text(errors="replace").count("could not serialize access")


def submit_throughput(args, root: Path, cluster: PostgresCluster, keys: procs.LocalDeployment) -> None:
    tokens_file = root / "clients.tokens"
    tokens = add_clients(tokens_file, [f"load-{i}" for i in range(args.clients)])
    credentials = keys.client_tls().credentials()
    payload = payload_field()
    rows = []
    runs = [("SQLite, 1 replica", 1, False)] + [(f"PostgreSQL, {n} replica(s)", n, True) for n in (1, 2, 3)]
    for name, n, pg in runs:
        store = cluster.create_database(f"submit_{n}_{int(pg)}") if pg else ""
        services = replicas(root / f"submit-{n}-{int(pg)}", n, store, tokens_file, keys)
        retried = conflicts(cluster)
        try:
            addresses = [s.address for s in services]
            done, latencies, errors, wall = asyncio.run(
                drive(addresses, tokens, args.per_call, args.seconds, payload, credentials)
            )
        finally:
            for s in services:
                s.stop()
        rate, retried = done / wall, conflicts(cluster) - retried
        rows.append((name, rate))
        p50 = statistics.median(latencies) * 1e3 if latencies else float("nan")
        print(
            f"  load {load()}  {name}: {rate:,.0f} reports/s, p50 {p50:.1f} ms, errors {dict(errors) or 'none'}, "
            f"{retried} serialization failures retried"
        )
    base = rows[0][1]
    print(f"(a) Submit throughput, × one SQLite replica (load {load()}):")
    for name, rate in rows:
        print(f"    {name}: {rate:,.0f} reports/s = {rate / base:.2f}×")


def _sdk_loop(sdk, token: str, stop: threading.Event, acks: list[float], acked: set[bytes], lock) -> None:
    """Submit one report per call until ``stop``; the time of each acknowledgement into ``acks``."""
    from lac.client.errors import LacClientError

    payload = reports_pb2.SealedPayload(
        encoding=envelope.HPKE, key_id="0" * envelope.KEY_ID_CHARS, data=os.urandom(min(envelope.SEALED_SIZES))
    )
    while not stop.is_set():
        report = shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload)
        while not stop.is_set():
            try:
                sdk.submit_prepared([report], token=token)
            except LacClientError:
                continue  # the same report again (same idempotency id) until acknowledged
            with lock:
                acks.append(time.monotonic())
                acked.add(report.idempotency_id)
            break


def failover(args, root: Path, cluster: PostgresCluster, keys: procs.LocalDeployment) -> None:
    import lac.client
    import lac.client.submit
    from lac.common.database import PostgresDatabase

    lac.client.submit.randrange = lambda n: 0  # type: ignore[attr-defined]  # each SDK starts at its first address
    tokens_file = root / "clients.tokens"
    tokens = add_clients(tokens_file, [f"app-{i}" for i in range(args.failover_clients)])
    url = cluster.create_database("failover")
    services = replicas(root / "failover", 3, url, tokens_file, keys)
    times: dict[str, list[float]] = {"SIGKILL": [], "SIGSTOP": []}
    acked: set[bytes] = set()
    lock = threading.Lock()
    plan = [("SIGKILL", t % 3, args.after) for t in range(args.trials)]
    plan += [("SIGSTOP", t % 3, args.after_freeze) for t in range(args.freeze_trials)]
    try:
        for trial, (how, victim, after) in enumerate(plan):
            order = [services[(victim + k) % 3].address for k in range(3)]
            sdks = [  # the SDK's defaults: a call's deadline 30 s, connect timeout 10 s
                lac.client.ShufflerClient(order, keys.curator_public_key(), keys.client_tls()) for _ in tokens
            ]
            stop = threading.Event()
            acks: list[list[float]] = [[] for _ in tokens]
            threads = [
                threading.Thread(target=_sdk_loop, args=(sdk, t, stop, a, acked, lock))
                for sdk, t, a in zip(sdks, tokens, acks)
            ]
            for t in threads:
                t.start()
            time.sleep(2.0)  # every client submitting to the victim
            hit = time.monotonic()
            os.kill(services[victim].process.pid, getattr(signal, how))
            time.sleep(after)
            stop.set()
            if how == "SIGSTOP":
                os.kill(services[victim].process.pid, signal.SIGCONT)
            for t in threads:
                t.join(60)
            for sdk in sdks:
                sdk.close()
            took = [next((t - hit for t in a if t > hit), float("inf")) for a in acks]
            times[how] += took
            print(
                f"  load {load()}  trial {trial + 1}: {how} replica {victim}; next acknowledged Submit per client "
                f"after median {statistics.median(took) * 1e3:.0f} ms, max {max(took) * 1e3:.0f} ms"
            )
            if how == "SIGKILL":
                old = services[victim]
                old.process.wait()
                services[victim] = procs.start(
                    "shuffler", _args_of(old), root / "failover" / f"proc{victim}", tls=keys.client_tls(), port=old.port
                )
        db = PostgresDatabase(url)
        try:
            (accepted,) = db.execute("SELECT value FROM counters WHERE name = 'accepted'").fetchone()
        finally:
            db.close()
    finally:
        for s in services:
            s.stop()
    for how, took in times.items():
        if took:
            print(
                f"(b) failover, {how} → the next acknowledged Submit of each affected client ({len(took)} = "
                f"{len(took) // len(tokens)} trials × {len(tokens)} clients; load {load()}): median "
                f"{statistics.median(took):.2f} s, max {max(took):.2f} s (target ≤ 10 s)"
            )
    lost = "nothing lost" if accepted == len(acked) else "MISMATCH"
    print(f"    {len(acked):,} reports acknowledged, {accepted:,} stored: {lost}")


def _args_of(service: procs.Service) -> list[str]:
    """The serve flags a ``procs.start`` service was started with (less the host, port and port file)."""
    argv = list(service.process.args)
    start = argv.index("--port-file") + 2
    return argv[start:]


def synthetic_batches(items: tuple[str, ...], batches: int, per_batch: int):
    """``batches`` ReportItems of ``per_batch`` SYNTHETIC reports over ``items`` (see the module doc)."""
    from lac.curator.base.ngrams import ReportItems

    rng = np.random.default_rng(1)
    p = 1.0 / np.arange(1, len(items) + 1) ** 1.1
    cdf = np.cumsum(p / p.sum())
    out = []
    for _ in range(batches):
        sizes = np.minimum(rng.poisson(10.0, per_batch), len(items))
        cols = np.minimum(np.searchsorted(cdf, rng.random(int(sizes.sum()))), len(items) - 1)
        rows = np.repeat(np.arange(per_batch, dtype=np.int64), sizes)
        keys = np.unique(rows * len(items) + cols)
        rows, cols = keys // len(items), keys % len(items)
        indptr = np.zeros(per_batch + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=per_batch), out=indptr[1:])
        out.append(ReportItems(indptr, cols.astype(np.int32), np.ones(cols.size, dtype=np.int32), items))
    return out


def release_over_a_million(args, root: Path, cluster: PostgresCluster) -> None:
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service.config import CuratorConfig
    from lac.curator.store.store import CuratorStore

    corpus = Path(os.environ.get("LAC_DATA_DIR", Path.home() / ".cache" / "lac")) / "corpora" / "public.txt"
    if not corpus.exists():
        raise SystemExit(f"no public corpus at {corpus}: run `lac data` first")
    c = CuratorConfig(public_corpus=corpus)
    vocab = public_vocabulary(corpus, c.max_n, c.vocab_min_count, c.vocab_max_items, root / "prior")
    day = c.window_seconds
    window = int(time.time() // day)
    data = synthetic_batches(tuple(vocab.items), 100, 10_000)
    url = cluster.create_database("release")
    stores = {"SQLite": ("", root / "sqlite"), "PostgreSQL": (url, root / "pg")}
    for name, (store, state) in stores.items():
        t0 = time.perf_counter()
        s = CuratorStore(state / "state", store=store, shared_dir=state / "shared" if store else None)
        try:
            for b, items in enumerate(data):
                ids = [os.urandom(16) for _ in range(items.indptr.size - 1)]
                s.add_batch(f"synthetic-{b}", ids, lambda keep, it=items: it, [], day, windows=(window, window))
        finally:
            s.close()
        print(f"  load {load()}  {name}: 1,000,000 synthetic reports stored in {time.perf_counter() - t0:.0f} s")
    servers = {}
    try:
        for name, (store, state) in stores.items():
            flags = ["--state-dir", str(state / "state"), "--public-corpus", str(corpus), "--no-clean-estimate",
                     "--min-signal-share", "0", "--budget-epsilon", "1000000", "--insecure", "--min-free-disk-bytes",
                     "0"]  # fmt: skip
            if store:
                flags += ["--store", store, "--shared-dir", str(state / "shared")]
            servers[name] = procs.start("curator", flags, state / "proc", timeout=600)
        seconds: dict[str, list[float]] = {name: [] for name in stores}
        for r in range(args.releases):
            for name, server in servers.items():
                with grpc.insecure_channel(server.address) as ch:
                    request = curator_pb2.ReleaseRequest(
                        epsilon=0.1, delta=1e-8, force=True, first_window=window, last_window=window,
                        request_id=f"bench-{r}",
                    )  # fmt: skip
                    t0 = time.perf_counter()
                    curator_pb2_grpc.CuratorStub(ch).Release(request, timeout=1800)
                    seconds[name].append(time.perf_counter() - t0)
                print(f"  load {load()}  {name}: release {r + 1} over 1,000,000 reports in {seconds[name][-1]:.1f} s")
    finally:
        for server in servers.values():
            server.stop()
    sq, pg = (statistics.median(seconds[n]) for n in ("SQLite", "PostgreSQL"))
    print(
        f"(c) release over 1,000,000 stored reports (median of {args.releases}; load {load()}): SQLite {sq:.1f} s, "
        f"PostgreSQL {pg:.1f} s = {pg / sq:.2f}× (target ≤ 1.2×)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each Submit run")
    ap.add_argument("--clients", type=int, default=60, help="clients of the Submit runs")
    ap.add_argument("--per-call", type=int, default=10, help="reports per Submit in the throughput runs")
    ap.add_argument("--failover-clients", type=int, default=6, help="SDK clients of the failover trials")
    ap.add_argument("--trials", type=int, default=6, help="failover trials")
    ap.add_argument("--after", type=float, default=3.0, help="seconds the clients go on after each kill")
    ap.add_argument("--freeze-trials", type=int, default=2, help="failover trials with a frozen replica (SIGSTOP)")
    ap.add_argument("--after-freeze", type=float, default=40.0, help="seconds a replica stays frozen")
    ap.add_argument("--releases", type=int, default=3, help="releases on each database")
    ap.add_argument("--only", default="submit,failover,release", help="which parts to run")
    args = ap.parse_args()
    print(f"load {load()} at the start")
    cluster = PostgresCluster(durable=True)
    try:
        with tempfile.TemporaryDirectory(prefix="lac-bench-ha-") as tmp:
            root = Path(tmp)
            keys = procs.LocalDeployment.create(root / "keys")
            parts = args.only.split(",")
            if "submit" in parts:
                submit_throughput(args, root / "submit", cluster, keys)
            if "failover" in parts:
                failover(args, root / "failover", cluster, keys)
            if "release" in parts:
                release_over_a_million(args, root / "release", cluster)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
