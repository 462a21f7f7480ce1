#!/usr/bin/env python3
"""Bulk client registration: ``lac shuffler add-clients --count N`` (one locked append, one fsync)
against registering the same clients one ``add_client`` call at a time (one append and fsync each),
measured on a subsample in the same run.

    python benchmarks/bench_tokens.py [--count 10000] [--baseline 500]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchkit import load

from lac.shuffler.auth import add_client, add_clients


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000, help="clients registered in one call")
    ap.add_argument("--baseline", type=int, default=500, help="clients registered one call each")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lac-bench-tokens-") as d:
        bulk = Path(d) / "bulk" / "clients.tokens"
        bulk.parent.mkdir()
        t0 = time.perf_counter()
        add_clients(bulk, [f"client-{i}" for i in range(a.count)])
        bulk_s = time.perf_counter() - t0
        one = Path(d) / "one" / "clients.tokens"
        one.parent.mkdir()
        t0 = time.perf_counter()
        for i in range(a.baseline):
            add_client(one, f"client-{i}")
        one_s = (time.perf_counter() - t0) / a.baseline
    print(f"load {load()}")
    print(f"add_clients, {a.count:,} clients in one call: {bulk_s:.2f} s ({bulk_s / a.count * 1e6:.0f} µs/client)")
    print(
        f"  baseline, add_client one at a time ({a.baseline:,} measured): {one_s * 1e6:.0f} µs/client "
        f"-> bulk x{one_s * a.count / bulk_s:.0f} faster"
    )


if __name__ == "__main__":
    main()
