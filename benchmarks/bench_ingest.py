#!/usr/bin/env python3
"""All-core ingest: opening (HPKE), validating and counting sealed reports with 1, 2 and every core.

    python benchmarks/bench_ingest.py [--reports 200000] [--texts users|fortunes] [--workers 1,2,N] [--repeat 3]

Real reports: the simulated users' texts (``lac.suite.data.user_texts``, ~390k distinct short real
texts, one per user, in a fixed random order) or the BSD fortunes (the demo's users), tokenised
into sentences and cut into reports of at most L = 40 words (the default deployment's cap, as
clients split longer texts), repeated in order when more reports are asked for than there are;
words NOT perturbed; sealed with HPKE to a fresh curator key. Timed per worker count (best of ``--repeat``,
after the pool's workers have started): ``IngestPool.run`` (``lac.curator.ingest``: open, validate,
count every n-gram, chunk by chunk on the workers) plus ``merge_counts`` (the chunks' counts
combined into the batch's, as the store does before writing the segment). The results are checked
equal across worker counts. Writing the segment (Parquet, one file, serial) is timed once, apart.
The CPU time of all processes (Linux /proc) shows what the pool costs beyond the work itself: on a
busy machine it is the figure to trust, the wall-clock ratio needs the cores free.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from lac.common import envelope
from lac.common.deployment import Deployment
from lac.common.serde import mechanism_id
from lac.common.text import sentences
from lac.common.v1 import reports_pb2
from lac.curator import segments
from lac.curator.config import CORES, CuratorConfig
from lac.curator.ingest import MIN_POOL_BATCH, IngestContext, IngestPool, merge_counts
from lac.suite.data import load_users, user_texts


def reports(texts: list[str], n: int, max_words: int) -> list[list[list[str]]]:
    """``n`` reports of at most ``max_words`` words from ``texts``, in order (repeated as needed)."""
    out: list[list[list[str]]] = []
    while True:
        for text in texts:
            report: list[list[str]] = []
            words = 0
            for s in sentences(text):
                while s:
                    take = s[: max_words - words]
                    report.append(take)
                    words += len(take)
                    s = s[len(take) :]
                    if words == max_words:
                        out.append(report)
                        report, words = [], 0
                        if len(out) == n:
                            return out
            if report:
                out.append(report)
                if len(out) == n:
                    return out


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process and of ``pids`` (Linux /proc; the workers are not our children)."""
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=200_000)
    ap.add_argument("--texts", choices=("users", "fortunes"), default="users")
    ap.add_argument("--workers", default=f"1,2,{CORES}", help="comma-separated worker counts (1 = in process)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    counts = sorted({int(w) for w in a.workers.split(",")})
    d = Deployment()
    lp = reports_pb2.LocalPrivacy(
        mechanism=mechanism_id(d.mechanism), epsilon_per_word=d.epsilon_per_word, embedding=d.embedding
    )
    source = user_texts(0) if a.texts == "users" else load_users()
    source = [source[i] for i in np.random.default_rng(0).permutation(len(source))]  # the sources mixed
    texts = reports(source, a.reports, d.max_report_words)
    with tempfile.TemporaryDirectory() as kd:
        envelope.generate_key(kd)
        ring = envelope.CuratorKeyRing.load(kd)
    key = ring.public_key()
    t0 = time.perf_counter()
    payloads = [
        envelope.seal(
            reports_pb2.ReportContent(
                report_id=os.urandom(16), local_privacy=lp, sentences=[reports_pb2.Sentence(tokens=s) for s in r]
            ),
            key,
        ).SerializeToString()
        for r in texts
    ]
    t_seal = time.perf_counter() - t0
    n = len(payloads)
    n_words = sum(len(s) for r in texts for s in r)
    label = "simulated users' texts" if a.texts == "users" else "BSD fortunes"
    print(
        f"{n:,} real reports ({label}, unperturbed words, {n_words / n:.1f} words per report, "
        f"{sum(map(len, payloads)) / n:.0f} B sealed on average); sealed in {t_seal:.1f} s; "
        f"{CORES} core(s) available, load average {os.getloadavg()[0]:.2f}"
    )
    ctx = IngestContext.of(CuratorConfig(), ring, 3)
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
