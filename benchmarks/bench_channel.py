#!/usr/bin/env python3
"""The channel-aware release's cost: sampling the local channel once per deployment, building the
n-gram channel, and a default release with the channel against the same release without it
(the baseline, measured in the same run).

    python benchmarks/bench_channel.py [--draws 400] [--reports 1000000] [--epsilon 8]

Data: the curator's default release vocabulary (the public corpus, `lac data`), the default
embedding (GloVe 6B 50d, 50,000 words) and real user texts (`lac.suite.data.user_texts`) as the
reports, repeated to reach ``--reports`` (a timing benchmark: repeats cost what new texts cost).
The reports are counted as given (clean text): what is timed is the release, not the device.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=400, help="Monte-Carlo draws per word (the curator's default)")
    ap.add_argument("--epsilon", type=float, default=8.0, help="ε per word of the deployment")
    ap.add_argument("--reports", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="releases timed per variant (median)")
    ap.add_argument("--fresh", action="store_true", help="sample the channel anew (default: the data dir's cache)")
    args = ap.parse_args()

    from lac.common.paths import data_dir
    from lac.common.text import sentences
    from lac.curator.base.ngrams import report_items
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.mechanisms import ReleaseSpec
    from lac.curator.release.channel import NgramChannel, cached_word_channel, public_unk_words
    from lac.curator.release.core import ItemReports, PublicCaps
    from lac.curator.runner.run import run
    from lac.curator.service.config import CuratorConfig
    from lac.suite.data import prepare_corpora, user_texts

    cc = CuratorConfig()
    corpora = prepare_corpora()
    with tempfile.TemporaryDirectory() as tmp:
        vocab = public_vocabulary(corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items, Path(tmp))
        text = corpora.public_corpus.read_text(encoding="utf-8")
        t = time.perf_counter()
        word = cached_word_channel(
            Path(tmp) / "channel" if args.fresh else data_dir() / "eval-cache",
            vocab,
            cc.embedding,
            cc.local_mechanism,
            args.epsilon,
            lambda: public_unk_words(sentences(text), vocab),
            args.draws,
        )
        t_word = time.perf_counter() - t
    t = time.perf_counter()
    channel = NgramChannel.build(word, vocab)
    t_build = time.perf_counter() - t
    n_words = len(vocab.words)
    how = "sampled" if args.fresh else "sampled or read from the data dir's cache"
    print(f"word channel: {n_words:,} words x {args.draws} draws, {how} in {t_word:.1f} s (embedding load included)")
    nnz = {n: m.nnz for n, m in channel.matrices.items()}
    print(f"n-gram channel: built in {t_build:.1f} s (non-zeros per order: {nnz})")

    texts = user_texts(min_count=0)
    block = 20_000
    blocks = []
    i = 0
    while sum(b.n_reports for b in blocks) < args.reports:
        chunk = [sentences(texts[(i + k) % len(texts)]) for k in range(block)]
        blocks.append(report_items(chunk, cc.max_n, vocab.words))
        i += block
    reports = ItemReports(blocks, vocab)
    n = sum(b.n_reports for b in blocks)
    caps = PublicCaps(W=cc.max_items_per_report, C=cc.item_clamp)
    spec = ReleaseSpec(epsilon=1.0)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"plain": [], "channel": []}
    for _ in range(args.runs):
        for name, ch in (("plain", None), ("channel", channel)):
            t = time.perf_counter()
            run(reports, vocab, spec, caps, rng=rng, channel=ch)
            times[name].append(time.perf_counter() - t)
    plain, aware = float(np.median(times["plain"])), float(np.median(times["channel"]))
    print(
        f"release over {n:,} reports ({len(vocab):,} public n-grams), median of {args.runs}: without the channel "
        f"{plain:.2f} s (baseline), channel-aware {aware:.2f} s: {aware / plain:.2f}x"
    )


if __name__ == "__main__":
    main()
