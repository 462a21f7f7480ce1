#!/usr/bin/env python3
"""The empirical-Bayes fits of a release (``lac.curator.release.posterior.eb_fit``: 300 EM iterations of two
matrix-vector products per bin) with one BLAS thread (what the release does) against as many as there are cores
(numpy's default; the baseline), in one run, on real data: the users' texts (``lac.suite.data.user_texts``)
counted over the curator's default release vocabulary, with the Gaussian noise of a release at ε = 1.

    python benchmarks/bench_eb.py [--users 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from lac.common.config import CORES
from lac.common.text import sentences
from lac.curator.base.ngrams import report_items
from lac.curator.base.prior import public_vocabulary
from lac.curator.release import posterior
from lac.curator.release.posterior import PosteriorParams, weighted_totals
from lac.curator.service.config import CuratorConfig
from lac.suite.data import prepare_corpora, user_texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cc = CuratorConfig()
    with tempfile.TemporaryDirectory() as tmp:
        vocab = public_vocabulary(
            prepare_corpora().public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items, Path(tmp)
        )
    texts = user_texts(min_count=0)[: args.users]
    blocks = [report_items([[list(s) for s in sentences(t)] for t in texts], 3, vocab.words)]
    totals = weighted_totals(blocks, vocab, cc.max_items_per_report, cc.item_clamp, 1.0).public
    p = PosteriorParams(1.0, 1e-6)
    noisy = totals + p.sigma * np.random.default_rng(0).standard_normal(totals.size)
    print(f"{len(texts):,} users, {len(vocab):,} n-grams, σ = {p.sigma:.3f}, {CORES} cores, load {os.getloadavg()}")
    times: dict[int, list[float]] = {CORES: [], 1: []}
    for _ in range(args.runs):
        for threads in times:
            with threadpool_limits(threads, user_api="blas"):
                for n in (1, 2, 3):
                    sel = vocab.orders == n
                    t = time.perf_counter()
                    total = max(float(noisy[sel].sum()), 1.0)
                    mu = total * vocab.alpha[sel] / vocab.alpha[sel].sum()
                    posterior._eb_fit(noisy[sel], mu, p.sigma, p.bins)  # eb_fit without its one-thread limit
                    times[threads].append(time.perf_counter() - t)
    base, one = (sum(times[k]) / args.runs for k in (CORES, 1))
    print(
        f"eb_fit of the three orders: {CORES} BLAS threads {base:.2f} s (baseline), 1 thread {one:.2f} s: "
        f"{base / one:.2f}x; load now {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
