#!/usr/bin/env python3
"""Export of privatized reports: rows per second from local segments, against reading them with pyarrow alone.

    python benchmarks/bench_export.py [--reports 1000000] [--per-batch 10000] [--repeat 3]

SYNTHETIC data (a speed and memory benchmark only, not language): ``--reports`` reports of 1-40 words
(Poisson(10) + 1, capped at L = 40) drawn Zipf(1.1)-like from 50,000 words, with three n-gram rows per
word as real segments have, stored through ``CuratorStore.add_batch`` (keeping words, as with export on) as
batches of ``--per-batch`` reports of one settled window (one segment and one words file each, the curator's
format). Timed, best of ``--repeat``:

* baseline: every batch's words file read with ``pyarrow.parquet.read_table`` (what any reader of the
  files pays; nothing shuffled, nothing sent);
* library: ``lac.curator.store.export.ShuffledReports`` (step 1: read and spool to B buckets; step 2: permute
  each bucket) and every chunk serialized as the Arrow IPC message the server sends;
* end to end: a real curator server (in this process, plaintext gRPC on 127.0.0.1:0) streaming
  ``ExportReports`` to ``CuratorClient.export_reports(window, path=...)``, which writes the Parquet file.

Each is printed as rows/s and as a ratio to the baseline measured in the same run; the library's peak
Arrow memory (``pyarrow.default_memory_pool().max_memory()``, in a fresh process per variant would be
cleaner; here it is the high-water mark after the baseline) shows the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

N_WORDS = 50_000


def make_store(state: Path, reports: int, per_batch: int, window: int) -> list[Path]:
    """The synthetic batches stored as a curator with export on stores them; returns their words files."""
    from lac.common.deployment import Deployment
    from lac.common.v1 import reports_pb2
    from lac.curator.base.ngrams import ReportItems
    from lac.curator.store.store import CuratorStore

    rng = np.random.default_rng(1)
    names = np.array([f"w{j}" for j in range(N_WORDS)], dtype=object)
    p = 1.0 / np.arange(1, N_WORDS + 1) ** 1.1
    cdf = np.cumsum(p / p.sum())
    d = Deployment()
    store = CuratorStore(state, keep_words=True)
    try:
        for b, start in enumerate(range(0, reports, per_batch)):
            n = min(per_batch, reports - start)
            lens = np.minimum(rng.poisson(10, n) + 1, d.max_report_words)
            words = names[np.minimum(np.searchsorted(cdf, rng.random(int(lens.sum()))), N_WORDS - 1)]
            offsets = np.zeros(n + 1, dtype=np.int32)
            np.cumsum(lens, out=offsets[1:])
            texts = pa.ListArray.from_arrays(pa.array(offsets), pa.array(words.tolist(), pa.string()))
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(3 * lens, out=indptr[1:])
            ids = rng.integers(0, N_WORDS, int(indptr[-1])).astype(np.int32)
            items = ReportItems(indptr, ids, np.ones(ids.size, np.int32), tuple(names.tolist()), texts)
            privacy = reports_pb2.BatchPrivacy(
                n_reports=n,
                distinct_clients=True,
                reports_per_window=1,
                window_seconds=d.window_seconds,
                first_window=window,
                last_window=window,
                report_epsilon0=d.report_epsilon0,
                central_epsilon=d.report_epsilon0,
                method="none",
            ).SerializeToString()
            store.add_batch(
                f"bench-{b}",
                [os.urandom(16) for _ in range(n)],
                lambda _keep, items=items: items,
                [],
                86400.0,
                privacy=privacy,
                windows=(window, window),
            )
        return [store.words_dir / b[4] for b in store.export_batches(window, window)]
    finally:
        store.close()


def baseline(paths: list[Path]) -> int:
    rows = 0
    for path in paths:
        rows += pq.read_table(path, columns=["words"]).num_rows
    return rows


def library(paths: list[Path], expected: int, spool: Path) -> tuple[int, int]:
    from lac.common.exports import ipc_bytes
    from lac.common.rng import secure_generator
    from lac.curator.store import export

    rows = 0
    with export.ShuffledReports(paths, secure_generator(), expected, spool) as s:
        for col in s.chunks():
            ipc_bytes(col)  # the message the server sends
            rows += len(col)
        return rows, s.buckets


class Server:
    """A real curator server on its own event loop thread."""

    def __init__(self, state: Path):
        from lac.curator.base.ngrams import NgramVocabulary
        from lac.curator.service import lifecycle
        from lac.curator.service.config import CuratorConfig
        from lac.curator.service.server import create_server

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        config = CuratorConfig(
            state_dir=state, port=0, insecure=True, export_identities="bench", clean_estimate=False, ingest_workers=1
        )
        vocab = NgramVocabulary.from_sentences([["a", "b"]], max_n=3)

        async def start():
            self.curator = lifecycle.open_state(config, vocab)
            self.server, port = create_server(self.curator)
            await self.server.start()
            return port

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(60)

    def stop(self) -> None:
        from lac.curator.service import lifecycle

        async def stop():
            await self.server.stop(1)
            await lifecycle.stop(self.curator)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reports", type=int, default=1_000_000)
    ap.add_argument("--per-batch", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from lac.analyst import CuratorClient
    from lac.common.deployment import Deployment

    window = Deployment().window(time.time()) - 3  # settled at the curator's defaults
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        t = time.perf_counter()
        paths = make_store(state, args.reports, args.per_batch, window)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"{args.reports:,} synthetic reports in {len(paths)} words files ({size / 2**20:.0f} MiB), "
            f"stored in {time.perf_counter() - t:.0f} s"
        )

        def best(fn):
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
            return min(times), out

        t_base, rows = best(lambda: baseline(paths))
        pool = pa.default_memory_pool()
        before = pool.max_memory()
        t_lib, (lib_rows, buckets) = best(lambda: library(paths, args.reports, Path(tmp) / "spool"))
        peak = pool.max_memory()
        assert lib_rows == rows, (lib_rows, rows)
        server = Server(state)
        try:
            out = Path(tmp) / "export.parquet"

            def end_to_end():
                with CuratorClient(f"127.0.0.1:{server.port}", insecure=True) as c:
                    got = c.export_reports(window, path=out)
                return got.rows

            t_e2e, e2e_rows = best(end_to_end)
            assert e2e_rows == rows and pq.read_metadata(out).num_rows == rows
        finally:
            server.stop()
        print(f"baseline (pyarrow reads the words files): {rows / t_base:,.0f} rows/s ({t_base:.2f} s)")
        print(
            f"library (spool to {buckets} buckets, permute, IPC): {rows / t_lib:,.0f} rows/s ({t_lib:.2f} s), "
            f"{t_base / t_lib:.2f}x the baseline's rate; Arrow peak {max(peak, before) / 2**20:.0f} MiB"
        )
        print(
            f"end to end (gRPC stream -> CuratorClient -> Parquet file): {rows / t_e2e:,.0f} rows/s ({t_e2e:.2f} s), "
            f"{t_base / t_e2e:.2f}x the baseline's rate"
        )


if __name__ == "__main__":
    main()
