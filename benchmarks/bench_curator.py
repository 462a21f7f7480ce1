#!/usr/bin/env python3
"""BayesianDP release with exact brute-force sensitivity at scale (SYNTHETIC Zipf data:
this is a speed benchmark only, not language). Prints time, peak memory, and the ratio
against a straightforward per-user loop measured on a subsample in the same run.

    python benchmarks/bench_curator.py [--users 1000000] [--items 50000] [--per-user 25]

Releases over stored Parquet segments, streamed or in memory, are measured by
``benchmarks/bench_release_scale.py``.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import scipy.sparse as sp

from lac.curator.release.bayesian import BayesianParams, bayesian_dp, decay_weights, log_mean_center


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
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    t = time.perf_counter()
    U = zipf_users(a.users, a.items, a.per_user, rng)
    print(
        f"synthetic Zipf data: {a.users:,} users x {a.items:,} items, {U.nnz:,} non-zeros "
        f"(built in {time.perf_counter() - t:.1f}s)"
    )
    alpha = rng.poisson(5.0, a.items).astype(float)
    params = BayesianParams(epsilon=1.0, delta=1e-6, S=0.01, C=1, rho=0.5, sensitivity="bruteforce")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    times = []
    for _ in range(3):
        t = time.perf_counter()
        release = bayesian_dp(U, alpha, params, np.random.default_rng(0))
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    fast = min(times)
    print(
        f"bayesian_dp (brute force): best of 3 {fast:.2f}s, gamma={release.gamma:.6g}, "
        f"peak RSS {rss:.2f} GiB (before the release: {rss0:.2f} GiB, mostly building the data)"
    )
    sample = rng.choice(a.users, size=a.naive_sample, replace=False)
    t = time.perf_counter()
    naive_gamma_on(U, sample, params.S, params.C)
    per_user = (time.perf_counter() - t) / a.naive_sample
    print(
        f"per-user loop: {per_user * 1e3:.2f} ms/user on {a.naive_sample} users -> "
        f"{per_user * a.users:.0f}s extrapolated; ratio {per_user * a.users / fast:.0f}x"
    )


if __name__ == "__main__":
    main()
