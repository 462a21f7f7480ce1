"""The evaluation's data: public trigram vocabulary (Wikipedia + Lee news) and private users (fortunes).

Public and private text come from different sources, as in the paper (Google Billion Word vs
Reddit). The release vocabulary holds only public trigrams (the paper's setting, §4.1); private
n-grams outside it are dropped when counting (``lac.curator.base.ngrams.count_reports``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from lac.common.paths import data_dir
from lac.common.rng import RandomSource
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary, count_reports
from lac.curator.base.prior import public_vocabulary
from lac.suite.data import load_users, prepare_corpora

from .config import EvalConfig

_RAW_C = 1 << 30  # "no clamp": the true private counts


def trigram_vocabulary(full: NgramVocabulary, size: int) -> NgramVocabulary:
    """The ``size`` most frequent public trigrams (``full`` is sorted most frequent first)."""
    keep = np.flatnonzero(full.orders == 3)[:size]
    return NgramVocabulary(tuple(full.items[i] for i in keep), full.alpha[keep], 3)


@dataclass(frozen=True, eq=False)
class Counts:
    """Per-user counts over one vocabulary: ``U`` as the mechanisms see them (W cap, C clamp),
    ``raw`` the true counts (no cap, no clamp), from which the private distribution is taken."""

    vocab: NgramVocabulary
    U: sp.csr_matrix
    raw: sp.csr_matrix

    def subset(self, rows: np.ndarray) -> Counts:
        """The counts of the users (rows) ``rows`` only."""
        return Counts(self.vocab, self.U[rows], self.raw[rows])

    def without(self, row: int) -> Counts:
        """The counts without user ``row`` (the adjacent data set of membership inference)."""
        keep = np.delete(np.arange(self.U.shape[0]), row)
        return self.subset(keep)

    @cached_property
    def private_distribution(self) -> np.ndarray:
        """The true n-gram distribution of the raw counts (uniform if they are all zero)."""
        c = np.asarray(self.raw.sum(axis=0)).ravel().astype(np.float64)
        return c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)

    @property
    def alpha(self) -> np.ndarray:
        """The vocabulary's public counts (the prior)."""
        return self.vocab.alpha


def count(vocab: NgramVocabulary, reports, cfg: EvalConfig) -> Counts:
    """Counts of ``reports`` over ``vocab`` with the caps of ``cfg`` (and without, for ``raw``)."""
    return Counts(
        vocab,
        count_reports(reports, vocab, C=cfg.C, W=cfg.W).matrix,
        count_reports(reports, vocab, C=_RAW_C, W=None).matrix,
    )


@dataclass(frozen=True, eq=False)
class EvalData:
    """Everything the experiments share: vocabularies, training reports, held-out sentences, counts, config."""

    full_vocab: NgramVocabulary  # all public n-grams (orders 1-3, count >= 2), most frequent first
    vocab: NgramVocabulary  # release vocabulary of figures 1-6: public trigrams
    train_reports: list[list[list[str]]]  # one report (list of sentences) per training user
    heldout_sentences: list[list[str]]
    counts: Counts  # training users over ``vocab``
    sizes: dict
    config: EvalConfig

    def counts_for(self, vocab: NgramVocabulary, reports=None) -> Counts:
        """Counts of the training users (or of ``reports``) over ``vocab``, capped as the config says."""
        return count(vocab, self.train_reports if reports is None else reports, self.config)

    def counts_for_config(self, vocab: NgramVocabulary, cfg: EvalConfig, reports=None) -> Counts:
        """Like ``counts_for``, with the caps of ``cfg`` instead of the data's config."""
        return count(vocab, self.train_reports if reports is None else reports, cfg)

    @cached_property
    def lm_vocab(self) -> NgramVocabulary:
        """The curator's kind of release vocabulary: the most frequent public n-grams of orders 1–3."""
        k = self.config.lm_vocab_size
        return NgramVocabulary(self.full_vocab.items[:k], self.full_vocab.alpha[:k], 3)


def load(config: EvalConfig, rng: RandomSource) -> EvalData:
    """Corpora (prepared as by ``lac data`` if missing), the user split and the counts."""
    corpora = prepare_corpora()
    full = public_vocabulary(
        corpora.public_corpus, max_n=3, min_count=2, max_items=10**9, cache_dir=data_dir() / "eval-cache"
    )
    vocab = trigram_vocabulary(full, config.vocab_size)
    users = load_users()
    order = rng.permutation(len(users))
    if config.max_users is not None:
        order = order[: config.max_users]
    n_held = round(config.heldout_fraction * order.size)
    train = [sentences(users[i]) for i in order[n_held:]]
    held = [s for i in order[:n_held] for s in sentences(users[i])]
    counts = count(vocab, train, config)
    pub_sents = sentences(corpora.public_corpus.read_text(encoding="utf-8"))
    sizes = {
        "public_sentences": len(pub_sents),
        "public_words": sum(map(len, pub_sents)),
        "public_ngrams": len(full),
        "public_trigrams": int((full.orders == 3).sum()),
        "vocab_size": len(vocab),
        "users_total": len(users),
        "train_users": len(train),
        "heldout_users": n_held,
        "train_words": sum(len(s) for r in train for s in r),
        "heldout_sentences": len(held),
        "heldout_words": sum(map(len, held)),
        "train_items_counted": int(counts.U.sum()),
        "train_items_raw": int(counts.raw.sum()),
        "train_users_with_items": int((np.diff(counts.raw.indptr) > 0).sum()),
        "items_with_private_mass": int((counts.private_distribution > 0).sum()),
    }
    return EvalData(full, vocab, train, held, counts, sizes, config)
