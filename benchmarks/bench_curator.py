#!/usr/bin/env python3
"""BayesianDP release with exact brute-force sensitivity at scale (SYNTHETIC Zipf data:
this is a speed benchmark only, not language). Prints time, peak memory, and the ratio
against a straightforward per-user loop measured on a subsample in the same run.

    python benchmarks/bench_curator.py [--users 1000000] [--items 50000] [--per-user 25] [--segments 10]

With --segments K > 0 it also writes the data as K stored segments (lac.curator.store.Segment,
the curator's on-disk format) and times reading them back into the release matrix
(``segment_counts``: W cap and C clamp at release time), as a release over RPC does.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lac.curator.bayesian import BayesianParams, bayesian_dp, decay_weights, log_mean_center
from lac.curator.ngrams import NgramVocabulary
from lac.curator.service import segment_counts
from lac.curator.store import Segment


def zipf_users(n_users: int, n_items: int, per_user: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Each user holds ~Poisson(per_user) distinct items drawn Zipf(1.1)-like over the vocabulary."""
    sizes = np.minimum(rng.poisson(per_user, n_users), n_items)
    p = 1.0 / np.arange(1, n_items + 1) ** 1.1
    cols = rng.choice(n_items, size=int(sizes.sum()), p=p / p.sum())
    rows = np.repeat(np.arange(n_users), sizes)
    U = sp.csr_matrix((np.ones(cols.size, dtype=np.int32), (rows, cols)), shape=(n_users, n_items))
    U.sum_duplicates()
    U.data[:] = 1  # C = 1 clamp
    return U


def naive_gamma_on(U: sp.csr_matrix, users: np.ndarray, S: float, C: int) -> float:
    """Per user: recompute c, N, x̂ and w without that user and take the ℓ2 distance (dense per user)."""
    c = np.asarray(U.sum(axis=0)).ravel().astype(float)
    N = np.diff(U.tocsc().indptr).astype(float)
    r = decay_weights(N, S, C) * log_mean_center(c)
    best = 0.0
    for n in users:
        row = U.getrow(n)
        c2, N2 = c.copy(), N.copy()
        c2[row.indices] -= row.data
        N2[row.indices] -= 1
        best = max(best, float(np.linalg.norm(r - decay_weights(N2, S, C) * log_mean_center(c2))))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--per-user", type=float, default=25.0)
    ap.add_argument("--naive-sample", type=int, default=300)
    ap.add_argument("--segments", type=int, default=10, help="0 = skip the stored-segment read-back")
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    t = time.perf_counter()
    U = zipf_users(a.users, a.items, a.per_user, rng)
    print(f"synthetic Zipf data: {a.users:,} users x {a.items:,} items, {U.nnz:,} non-zeros "
          f"(built in {time.perf_counter() - t:.1f}s)")
    alpha = rng.poisson(5.0, a.items).astype(float)
    params = BayesianParams(epsilon=1.0, delta=1e-6, S=0.01, C=1, rho=0.5)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    times = []
    for _ in range(3):
        t = time.perf_counter()
        release = bayesian_dp(U, alpha, params, np.random.default_rng(0))
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    fast = min(times)
    print(f"bayesian_dp (brute force): best of 3 {fast:.2f}s, gamma={release.gamma:.6g}, "
          f"peak RSS {rss:.2f} GiB (before the release: {rss0:.2f} GiB, mostly building the data)")
    sample = rng.choice(a.users, size=a.naive_sample, replace=False)
    t = time.perf_counter()
    naive_gamma_on(U, sample, params.S, params.C)
    per_user = (time.perf_counter() - t) / a.naive_sample
    print(f"per-user loop: {per_user * 1e3:.2f} ms/user on {a.naive_sample} users -> "
          f"{per_user * a.users:.0f}s extrapolated; ratio {per_user * a.users / fast:.0f}x")
    if a.segments > 0:
        bench_segments(U, alpha, a.segments)


def bench_segments(U: sp.csr_matrix, alpha: np.ndarray, k: int) -> None:
    """Store U as k segments and time reading them back into the release matrix."""
    items = tuple(f"w{j}" for j in range(U.shape[1]))
    vocab = NgramVocabulary(items, alpha + 1.0, 1)
    with tempfile.TemporaryDirectory() as d:
        cuts = np.linspace(0, U.shape[0], k + 1).astype(np.int64)
        t = time.perf_counter()
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            part = U[a:b]
            Segment(items, part.indptr.astype(np.int64), part.indices, part.data).save(Path(d) / f"{i}.npz")
        t_write = time.perf_counter() - t
        size = sum(p.stat().st_size for p in Path(d).iterdir())
        t = time.perf_counter()
        V = segment_counts((Segment.load(Path(d) / f"{i}.npz") for i in range(k)), vocab, C=1, W=100)
        t_read = time.perf_counter() - t
    assert V.shape == U.shape and (V != U).nnz == 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"stored segments: {k} files, {size / 2**20:.0f} MiB, written (fsync'd) in {t_write:.2f}s; read back "
          f"with W cap + C clamp in {t_read:.2f}s (identical matrix); peak RSS now {rss:.2f} GiB")


if __name__ == "__main__":
    main()
