#!/usr/bin/env python3
"""The channel-aware release's cost: getting the deployment's local channel ready (sampling the word channel,
building its n-gram products) and a default release with the channel against the same release without it; and
each of them with its error bars (the bootstrap, ``--error-bar-draws``) against the same release without.

    python benchmarks/bench_channel.py [--draws 55] [--min-draws 30] [--epsilon 8] [--compare] [--reports 1000000]
        [--error-bar-draws 100]

The word channel is sampled anew (no cache) with the curator's method: draws shared by public frequency
(``--draws`` per word on average, at least ``--min-draws``; ``channel_draws``), numpy's OS-seeded generator, the
fastest nearest-word kernel this CPU runs; the time is split into noise sampling, the nearest-word search, the
<unk> row and the rest (counting, the matrix). ``--compare`` also samples it with the old method in the same run
(``--old-draws`` for every word, the ChaCha20 CSPRNG, the AVX2 kernel) and prints the ratio; ``--old-every K`` times
the old method on every K-th word only and scales its time by K (it is linear in the words). ``--reports 0``
skips the release part.

Data: the curator's default release vocabulary (the public corpus, `lac data`), the default embedding (GloVe 6B
50d, 50,000 words) and real user texts (`lac.suite.data.user_texts`) as the reports, repeated to reach
``--reports`` (a timing benchmark: repeats cost what new texts cost). The reports are counted as given (clean
text): what is timed is the release, not the device.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from lac.curator.release.channel import CHANNEL_DRAWS, MIN_DRAWS
from lac.curator.release.errorbars import DRAWS, Bootstrap


def _timed(timers: Counter, name: str, fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[name] += time.perf_counter() - t

    return run


def sample_word_channel(vocab, embedding, epsilon, unk, draws, min_draws, old=False):
    """(word channel, seconds, seconds per part): the new method, or with ``old`` the method before issue 33."""
    import lac.client.channel as client_channel
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.nearest import NearestIndex
    from lac.common.rng import secure_generator
    from lac.curator.release.channel import word_channel

    timers: Counter = Counter()
    saved = (client_channel.sample_channel, client_channel.NearestIndex, MultivariateLaplace.sample_noise)
    calls = iter(("sampling the words", "sampling the <unk> row"))
    sampler = saved[0]
    client_channel.sample_channel = lambda *a, **k: _timed(timers, next(calls), sampler)(*a, **k)
    index = functools.partial(NearestIndex, isa="avx2") if old else NearestIndex
    client_channel.NearestIndex = lambda *a, **k: _wrap_query(index(*a, **k), timers)
    MultivariateLaplace.sample_noise = _timed(timers, "noise", saved[2])
    try:
        t = time.perf_counter()
        rng = secure_generator() if old else None
        mechanism = MultivariateLaplace(epsilon)

        def progress(done: int, total: int) -> None:
            timers["perturbations"] = total  # (a count, kept with the timers)

        word = word_channel(vocab, embedding, mechanism, unk, draws, rng, progress, draws if old else min_draws)
        return word, time.perf_counter() - t, timers
    finally:
        client_channel.sample_channel, client_channel.NearestIndex, MultivariateLaplace.sample_noise = saved


def _wrap_query(index, timers: Counter):
    index.query = _timed(timers, "nearest-word search", index.query)
    return index


def _parts(total: float, timers: Counter) -> str:
    words, unk = timers["sampling the words"], timers["sampling the <unk> row"]
    noise, nearest = timers["noise"], timers["nearest-word search"]
    rest = total - noise - nearest
    return (
        f"noise {noise:.1f} s, nearest-word search {nearest:.1f} s, counting and the matrix {rest:.1f} s "
        f"(of which the words' sampling {words:.1f} s, the <unk> row's {unk:.1f} s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=CHANNEL_DRAWS, help="Monte-Carlo draws per word on average")
    ap.add_argument("--min-draws", type=int, default=MIN_DRAWS, help="... and at least, for each word")
    ap.add_argument("--old-draws", type=int, default=400, help="draws of every word with the old method")
    ap.add_argument("--epsilon", type=float, default=8.0, help="ε per word of the deployment")
    ap.add_argument("--compare", action="store_true", help="also time the old method (uniform draws) in this run")
    ap.add_argument("--old-every", type=int, default=1, help="time the old method on every K-th word (scaled by K)")
    ap.add_argument("--reports", type=int, default=1_000_000, help="reports of the release part (0: skip it)")
    ap.add_argument("--runs", type=int, default=3, help="releases timed per variant (median)")
    ap.add_argument(
        "--error-bar-draws", type=int, default=DRAWS, help="bootstrap draws of the releases timed with error bars"
    )
    args = ap.parse_args()

    from lac.client.embedding import glove_default
    from lac.client.nearest import NearestIndex
    from lac.common.text import sentences
    from lac.curator.base.ngrams import NgramVocabulary, report_items
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.mechanisms import ReleaseSpec
    from lac.curator.release.building import ItemReports, PublicCaps
    from lac.curator.release.channel import NgramChannel, public_unk_words
    from lac.curator.runner.run import run
    from lac.curator.service.config import CuratorConfig
    from lac.suite.data import prepare_corpora, user_texts

    cc = CuratorConfig()
    corpora = prepare_corpora()
    with tempfile.TemporaryDirectory() as tmp:
        vocab = public_vocabulary(corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items, Path(tmp))
    unk = public_unk_words(sentences(corpora.public_corpus.read_text(encoding="utf-8")), vocab)
    t = time.perf_counter()
    embedding = glove_default(50_000)
    t_emb = time.perf_counter() - t
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; kernel {NearestIndex(embedding.vectors).isa}")
    word, t_word, timers = sample_word_channel(vocab, embedding, args.epsilon, unk, args.draws, args.min_draws)
    points = int(timers["perturbations"])
    print(
        f"word channel, new method: {len(vocab.words):,} words x {word.describe()}; "
        f"({points:,} perturbations with the <unk> row) sampled in {t_word:.1f} s (+ {t_emb:.1f} s to load the "
        f"embedding): {_parts(t_word, timers)}"
    )
    t = time.perf_counter()
    channel = NgramChannel.build(word, vocab)
    t_build = time.perf_counter() - t
    nnz = {n: m.nnz for n, m in channel.matrices.items()}
    print(
        f"n-gram channel: built in {t_build:.1f} s (non-zeros per order: {nnz}); "
        f"ready after {t_emb + t_word + t_build:.1f} s"
    )
    if args.compare:
        sub = vocab
        if args.old_every > 1:
            words = sorted(vocab.words)[:: args.old_every]
            sub = NgramVocabulary(tuple(words), np.ones(len(words)), 1)  # (uniform draws: the counts do not matter)
        _, t_old, old_timers = sample_word_channel(
            sub, embedding, args.epsilon, unk, args.old_draws, args.old_draws, old=True
        )
        scaled = t_old * args.old_every
        what = f"every {args.old_every}th word, time x{args.old_every}" if args.old_every > 1 else "every word"
        print(
            f"word channel, old method (uniform {args.old_draws} draws, ChaCha20, AVX2 kernel; {what}): {scaled:.1f} s "
            f"({_parts(t_old, old_timers)}, unscaled). New / old: {t_word / scaled:.3f} "
            f"({scaled / t_word:.1f}x faster); load average now {os.getloadavg()[0]:.2f}"
        )
    if args.reports <= 0:
        return

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
    boot = Bootstrap(args.error_bar_draws)
    variants = {
        "plain": (None, None),
        "channel": (channel, None),
        "plain+bars": (None, boot),
        "channel+bars": (channel, boot),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, (ch, errors) in variants.items():
            t, c = time.perf_counter(), time.process_time()
            run(reports, vocab, spec, caps, rng=rng, channel=ch, errors=errors)
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = {name: float(np.median(v)) for name, v in times.items()}
    med_cpu = {name: float(np.median(v)) for name, v in cpu.items()}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"release over {n:,} reports ({len(vocab):,} public n-grams), median of {args.runs} (load now {load}): "
        f"without the channel {med['plain']:.2f} s (baseline), channel-aware {med['channel']:.2f} s: "
        f"{med['channel'] / med['plain']:.2f}x"
    )
    for name in ("plain", "channel"):
        bars = f"{name}+bars"
        print(
            f"  {name} with error bars ({args.error_bar_draws} bootstrap draws): {med[bars]:.2f} s wall, "
            f"{med_cpu[bars]:.2f} s CPU, against {med[name]:.2f} s wall, {med_cpu[name]:.2f} s CPU without: "
            f"{med[bars] / med[name]:.2f}x wall, {med_cpu[bars] / med_cpu[name]:.2f}x CPU"
        )


if __name__ == "__main__":
    main()
