"""Client SDK throughput: noise sampling and exact nearest-word projection.

    python benchmarks/bench_client.py [--vocab 400000] [--quick]

Prints (all measured in this run, on this machine):
1. multivariate-Laplace noise vectors/s at d=50 (batched gamma radius x normalised
   standard_normal rows) vs the per-call ``multivariate_normal`` baseline;
2. exact projection (``NearestIndex.query``) words/s on real GloVe 6B 50d with the requested
   vocabulary (or the largest the wheel offers) vs a per-word numpy loop on a subsample;
3. on a SYNTHETIC 100k x 300 float32 Gaussian matrix (speed only, not language), the
   projection rate vs the machine's measured float32 GEMM rate (the GEMM bound).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time

import numpy as np

from lac.client.embedding import glove_default
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import NearestIndex


def _timeit(fn, min_time=1.0):
    """Best-of-runs seconds per call, running for at least ``min_time`` in total."""
    fn()  # warm-up
    best, total, runs = float("inf"), 0.0, 0
    while total < min_time or runs < 3:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, total, runs = min(best, dt), total + dt, runs + 1
    return best


def bench_noise(rng, quick):
    d, n = 50, 100_000
    mech = MultivariateLaplace(10.0)
    t = _timeit(lambda: mech.sample_noise(n, d, rng))
    fast = n / t
    calls = 200 if quick else 1000
    mean, cov = np.zeros(d), np.eye(d)

    def baseline():
        for _ in range(calls):
            z = rng.multivariate_normal(mean, cov)
            z *= rng.gamma(d, 1 / 10.0) / np.linalg.norm(z)

    tb = _timeit(baseline, min_time=0.5)
    slow = calls / tb
    print(f"noise d=50: batched {fast:,.0f} vectors/s; per-call multivariate_normal {slow:,.0f} vectors/s "
          f"(x{fast / slow:,.0f})")
    return fast, slow


def _glove(vocab):
    try:
        return glove_default(vocab)
    except ValueError as e:
        m = re.search(r"only (\d+) single-token words", str(e))
        if not m:
            raise
        n = int(m.group(1))
        print(f"(GloVe offers only {n} single-token words; using {n})")
        return glove_default(n)


def bench_glove(rng, vocab, quick):
    t0 = time.perf_counter()
    emb = _glove(vocab)
    print(f"GloVe {emb.name}: {emb.size} x {emb.dim} loaded in {time.perf_counter() - t0:.1f}s "
          f"(first run builds the cache, incl. the exact diameter {emb.diameter():.4f})")
    index = NearestIndex(emb.vectors, emb.norms2)
    m = 2_000 if quick else 10_000
    ids = rng.integers(0, emb.size, m)
    pts = np.asarray(emb.vectors[ids], np.float64) + MultivariateLaplace(10.0).sample_noise(m, emb.dim, rng)
    t = _timeit(lambda: index.query(pts), min_time=1.0)
    fast = m / t
    v64 = np.asarray(emb.vectors, np.float64)
    sub = pts[:20]

    def loop():
        return [int(np.argmin(((v64 - p) ** 2).sum(axis=1))) for p in sub]

    tl = _timeit(loop, min_time=1.0)
    slow = len(sub) / tl
    assert loop() == list(index.query(sub))
    print(f"exact projection, GloVe {emb.size}x{emb.dim}: {fast:,.0f} words/s; per-word numpy loop "
          f"{slow:,.1f} words/s (x{fast / slow:,.0f}); same answers on the subsample")
    return emb.size, fast, slow


def bench_synthetic(rng, quick):
    size, dim = 100_000, 300
    v = rng.standard_normal((size, dim)).astype(np.float32)  # SYNTHETIC (speed only)
    index = NearestIndex(v)
    m = 500 if quick else 2_000
    pts = v[rng.integers(0, size, m)].astype(np.float64) + rng.standard_normal((m, dim)) * 0.5
    t = _timeit(lambda: index.query(pts), min_time=1.0)
    rate = m / t
    a = rng.standard_normal((m, dim + 1)).astype(np.float32)
    b = rng.standard_normal((dim + 1, size)).astype(np.float32)
    tg = _timeit(lambda: a @ b, min_time=1.0)
    flops = 2.0 * m * (dim + 1) * size / tg
    bound = flops / (2.0 * (dim + 1) * size)
    print(f"exact projection, SYNTHETIC {size}x{dim} float32: {rate:,.0f} words/s; float32 GEMM "
          f"{flops / 1e9:,.1f} GFLOP/s -> GEMM-only bound {bound:,.0f} words/s ({100 * rate / bound:.0f}% of it)")
    return rate, flops, bound


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=400_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)  # benchmark only: no privacy output leaves this script
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}, python "
          f"{platform.python_version()}")
    bench_noise(rng, args.quick)
    bench_glove(rng, args.vocab, args.quick)
    bench_synthetic(rng, args.quick)


if __name__ == "__main__":
    main()
