#!/usr/bin/env python3
"""How well the curator's local channel predicts real perturbed text (issue 32 item 3), and why not.

Real users' texts (``lac.suite.data.user_texts``, a random sample) are privatized by the real Localizer at the
balanced preset (ε = 8 per word over GloVe 50k, the deployment's L cut) and counted over the default release
vocabulary's unigrams, clean and perturbed, without DP noise and without the per-report weights (the channel's own
error, nothing else). The channel's prediction of the perturbed totals, A·x_clean, is compared with them: the median
and 90th percentile relative error over the unigrams seen at least 50 times perturbed, and the mass-weighted error.
Then the rows of the ``--top`` most frequent clean words are sampled again with ``--draws`` draws each (the rest as
cached) and the same errors printed: what the Monte-Carlo error of the frequent words' rows costs. Not a speed
benchmark; nothing here is timed.

    python benchmarks/channel_error.py [--users 20000] [--top 40] [--draws 10000]
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings

import numpy as np

from lac.client.channel import sample_channel
from lac.client.embedding import glove_default
from lac.client.errors import PartlyUnsupportedText
from lac.client.localizer import Localizer, fit_words
from lac.client.mechanisms import MultivariateLaplace
from lac.common.paths import data_dir
from lac.common.text import sentences
from lac.curator.base.ngrams import report_items
from lac.curator.base.prior import public_vocabulary
from lac.curator.release.building import vocab_counts
from lac.curator.release.channel import deployment_channel
from lac.curator.service.config import CuratorConfig
from lac.suite.data import prepare_corpora, user_texts

EPSILON = 8.0


def errors(pred: np.ndarray, observed: np.ndarray) -> str:
    seen = observed >= 50
    rel = np.abs(pred[seen] - observed[seen]) / observed[seen]
    mass = np.abs(pred[seen] - observed[seen]).sum() / observed[seen].sum()
    return (
        f"median relative error {np.median(rel):.3f}, 90th percentile {np.quantile(rel, 0.9):.3f}, "
        f"mass-weighted {mass:.3f} ({seen.sum()} unigrams seen >= 50 times)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--top", type=int, default=40, help="most frequent clean words whose rows are sampled again")
    ap.add_argument("--draws", type=int, default=10_000, help="draws of each of those rows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cc = CuratorConfig()
    corpora = prepare_corpora()
    vocab = public_vocabulary(corpora.public_corpus, cc.max_n, 2, 50_000, data_dir() / "eval-cache")
    emb = glove_default(50_000)
    channel = deployment_channel(
        data_dir() / "eval-cache", vocab, corpora.public_corpus, emb.name, "multivariate-laplace", EPSILON
    )
    rng = np.random.default_rng(args.seed)
    texts = user_texts(min_count=0)
    texts = [texts[i] for i in rng.choice(len(texts), args.users, replace=False)]
    deployment = dataclasses.replace(
        cc.deployment, embedding=emb.name, word_distance_bound=emb.diameter(), epsilon_per_word=EPSILON
    )
    localizer = Localizer(emb, MultivariateLaplace(EPSILON), rng=rng, deployment=deployment, calibrated=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartlyUnsupportedText)
        perturbed = [[list(s) for s in r.sentences] for r in localizer.privatize_many(texts)]
    clean = [fit_words(sentences(t), deployment.max_report_words)[0] for t in texts]

    def unigram_totals(reports) -> np.ndarray:
        counts = vocab_counts(iter([report_items(reports, 3, vocab.words)]), vocab, 10**6, 10**6)
        return np.asarray(counts.sum(axis=0)).ravel().astype(float)[channel.columns[1]]

    x, y = unigram_totals(clean), unigram_totals(perturbed)
    A = channel.order(1, vocab).tocsr()
    print(f"{args.users:,} real users, balanced preset (ε = {EPSILON:g}); the channel: {channel.word.describe()}")
    print(f"  as cached: {errors(A @ x, y)}")
    items = [vocab.items[c] for c in channel.columns[1]]
    pos = {w: i for i, w in enumerate(items)}
    top = [items[i] for i in np.argsort(-x) if items[i] in emb.index][: args.top]
    counts = sample_channel(
        emb, MultivariateLaplace(EPSILON), np.array([emb.index[w] for w in top]), args.draws, np.random.default_rng(5)
    )
    out_class = np.array([pos.get(w, pos["<unk>"]) for w in emb.words])
    resampled = A.tolil()
    for i, w in enumerate(top):
        lo, hi = counts.indptr[i], counts.indptr[i + 1]
        column = np.zeros(len(items))
        np.add.at(column, out_class[counts.cols[lo:hi]], counts.counts[lo:hi] / args.draws)
        resampled[:, pos[w]] = column[:, None]
    share = x[[pos[w] for w in top]].sum() / x.sum()
    print(f"  the {args.top} most frequent words ({share:.0%} of the clean words) at {args.draws:,} draws each:")
    print(f"    {errors(resampled.tocsr() @ x, y)}")


if __name__ == "__main__":
    main()
