#!/usr/bin/env python3
"""All-core ingest: opening (HPKE), validating and counting sealed reports with 1, 2 and every core.

    python benchmarks/bench_ingest.py [--reports 200000] [--texts users|fortunes] [--workers 1,2,N] [--repeat 3]
    python benchmarks/bench_ingest.py --sizes 200,1000,5000,20000,100000 [--repeat 5]

Real reports: the simulated users' texts (``lac.suite.data.user_texts``, ~390k distinct short real
texts, one per user, in a fixed random order) or the BSD fortunes (the demo's users), tokenised
into sentences and cut into reports of at most L = 40 words (the default deployment's cap, as
clients split longer texts), repeated in order when more reports are asked for than there are;
words NOT perturbed; sealed with HPKE to a fresh curator key. Timed per worker count (best of ``--repeat``,
after the pool's workers have started): ``IngestPool.run`` (``lac.curator.ingest.chunks``: open, validate,
count every n-gram, chunk by chunk on the workers) plus ``merge_counts`` (the chunks' counts
combined into the batch's, as the store does before writing the segment). The results are checked
equal across worker counts. Writing the segment (Parquet, one file, serial) is timed once, apart.
The CPU time of all processes (Linux /proc) shows what the pool costs beyond the work itself: on a
busy machine it is the figure to trust, the wall-clock ratio needs the cores free.

``--sizes``: batches of each size (the first reports of the same set), each timed with one in-process
worker (the baseline of the row), with the pool of every core kept warm (started before, as the curator
starts it with the server; forced to pool even below ``MIN_POOL_BATCH``), with a cold pool (a fresh
pool whose workers start with this batch: what a first batch paid when workers started on first use),
and with the curator's policy (the warm pool from ``MIN_POOL_BATCH`` reports, in process below).
Measurements alternate between the variants, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchkit import cpu_seconds, real_reports, sealed_payloads

from lac.common import envelope
from lac.curator.ingest.chunks import MIN_POOL_BATCH, IngestContext, IngestPool, merge_counts
from lac.curator.service.config import CORES, CuratorConfig
from lac.curator.store import segments


def _batch_seconds(pool: IngestPool, payloads: list[bytes]) -> float:
    """Seconds to count one batch as the curator does: the pool's chunks, then merged."""
    t0 = time.perf_counter()
    chunks = pool.run(payloads)
    merge_counts(chunks, range(sum(len(c.ids) for c in chunks)))
    return time.perf_counter() - t0


def by_size(ctx: IngestContext, payloads: list[bytes], sizes: list[int], repeat: int) -> None:
    """Per batch size: one in-process worker against a warm pool, a cold pool and the curator's policy."""
    one = IngestPool(ctx, 1)
    warm = IngestPool(ctx, CORES, min_pool_batch=1)  # always pooled, workers started before timing
    policy = IngestPool(ctx, CORES)  # the curator's: pooled from MIN_POOL_BATCH reports, warm
    try:
        warm.start()
        policy.start()
        print(f"batches of the first n reports; {CORES} workers; MIN_POOL_BATCH = {MIN_POOL_BATCH:,}")
        print(
            "| reports | 1 worker, in process | warm pool | vs 1 worker | cold pool (first batch) | vs 1 worker "
            "| curator's policy | vs 1 worker |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n in sizes:
            batch = payloads[:n]
            best = {"one": float("inf"), "warm": float("inf"), "policy": float("inf")}
            for _ in range(repeat):  # interleaved, so that other work on the machine hits each alike
                for name, pool in (("one", one), ("warm", warm), ("policy", policy)):
                    best[name] = min(best[name], _batch_seconds(pool, batch))
            cold_pool = IngestPool(ctx, CORES, min_pool_batch=1)
            try:
                cold = _batch_seconds(cold_pool, batch)
            finally:
                cold_pool.close()
            base = best["one"]
            print(
                f"| {n:,} | {1e3 * base:,.0f} ms | {1e3 * best['warm']:,.0f} ms | {base / best['warm']:.2f}x | "
                f"{1e3 * cold:,.0f} ms | {base / cold:.2f}x | {1e3 * best['policy']:,.0f} ms "
                f"({'pool' if policy.pooled(n) else 'in process'}) | {base / best['policy']:.2f}x |"
            )
    finally:
        for pool in (one, warm, policy):
            pool.close()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=200_000)
    ap.add_argument("--texts", choices=("users", "fortunes"), default="users")
    ap.add_argument("--workers", default=f"1,2,{CORES}", help="comma-separated worker counts (1 = in process)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="", help="comma-separated batch sizes: the pool against one worker at each")
    a = ap.parse_args()
    sizes = sorted({int(n) for n in a.sizes.split(",") if n})
    if sizes:
        a.reports = max(sizes)
    counts = sorted({int(w) for w in a.workers.split(",")})
    texts = real_reports(a.reports, a.texts)
    with tempfile.TemporaryDirectory() as kd:
        envelope.generate_key(kd)
        ring = envelope.CuratorKeyRing.load(kd)
    key = ring.public_key()
    t0 = time.perf_counter()
    payloads = sealed_payloads(texts, key)
    t_seal = time.perf_counter() - t0
    n = len(payloads)
    n_words = sum(len(s) for r in texts for s in r)
    label = "simulated users' texts" if a.texts == "users" else "BSD fortunes"
    print(
        f"{n:,} real reports ({label}, unperturbed words, {n_words / n:.1f} words per report, "
        f"{sum(map(len, payloads)) / n:.0f} B sealed on average); sealed in {t_seal:.1f} s; "
        f"{CORES} core(s) available, load average {os.getloadavg()[0]:.2f}"
    )
    ctx = CuratorConfig().ingest_context(ring, 3)
    if sizes:
        return by_size(ctx, payloads, sizes, a.repeat)
    base = None
    reference = None
    print("| workers | chunks | time | reports/s | reports/s per core | vs 1 worker | CPU per report, all processes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workers in counts:
        pool = IngestPool(ctx, workers)
        try:
            pool.run(payloads[: max(MIN_POOL_BATCH, 2 * workers)])  # start the workers (not timed)
            best, cpu = float("inf"), float("inf")
            for _ in range(a.repeat):
                pids = pool.worker_pids()
                c0, t0 = cpu_seconds(pids), time.perf_counter()
                chunks = pool.run(payloads)
                items = merge_counts(chunks, range(sum(len(c.ids) for c in chunks)))
                best = min(best, time.perf_counter() - t0)
                cpu = min(cpu, cpu_seconds(pids) - c0)
        finally:
            pool.close()
        if reference is None:
            reference = items
        else:  # the same counts however the batch was split
            assert items.items == reference.items and (items.item_ids == reference.item_ids).all()
            assert (items.counts == reference.counts).all() and (items.indptr == reference.indptr).all()
        rate = n / best
        base = base or rate
        print(
            f"| {workers} | {len(chunks)} | {best:.2f} s | {rate:,.0f} | {rate / min(workers, CORES):,.0f} | "
            f"{rate / base:.2f}x | {1e6 * cpu / n:.0f} µs |"
        )
    with tempfile.TemporaryDirectory() as sd:
        t0 = time.perf_counter()
        segments.write(Path(sd) / "s.parquet", reference, {"batch_id": "bench"})
        t_write = time.perf_counter() - t0
    print(
        f"{n - reference.n_reports} report(s) quarantined (e.g. a token over 64 characters); then the store "
        f"writes the batch's segment (serial, {len(reference.items):,} distinct n-grams): "
        f"{t_write:.2f} s, {1e6 * t_write / n:.0f} µs per report"
    )


if __name__ == "__main__":
    main()
