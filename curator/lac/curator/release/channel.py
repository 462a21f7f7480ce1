"""Channel-aware estimation: the users' *clean* n-gram statistics from a DP release of their
*perturbed* reports.

Every word of a report was replaced on the device by a nearby word (``lac.client``); the curator
counts the perturbed text. The local mechanism is public — the embedding, the mechanism and ε per
word are in the curator's published deployment — so its channel P(output | input) is public too:

* ``WordChannel``: P(output class | clean class) over the curator's word classes (its public word
  list, ``<unk>`` for every other word, ``<s>``/``</s>`` unchanged), estimated by Monte Carlo with
  the real mechanism and exact nearest-word search (``lac.client.channel.sample_channel``). The words
  share ``CHANNEL_DRAWS`` draws each on average by public frequency, at least ``MIN_DRAWS`` each
  (``channel_draws``: half of the rest ∝ count, since the error of the predicted perturbed totals comes
  from the frequent words' rows times their counts; half ∝ √count, for each word's own relative error).
  Each row states its own standard error. The clean ``<unk>`` row is the mixture over the public
  corpus's words outside the word list.
* ``NgramChannel``: the n-gram channel over the release vocabulary. Words are perturbed
  independently, so P(j' | j) = Πₜ P(j'ₜ | jₜ): one sparse |P_n| × |P_n| matrix per order n
  (observed public n-gram j' from clean public n-gram j).
* ``deconvolve``: the clean totals x ≥ 0 from observed totals, by the expectation–maximisation
  of Poisson deconvolution with censoring (Richardson–Lucy / the iterative Bayesian update of
  LDP frequency estimation), started at the public prior (or, where asked and it fits the observed totals
  better, at the item-wise estimate ``item_estimate``) and stopped by the discrepancy
  principle: as soon as the fit explains the observed totals to within their noise (the DP
  Gaussian's σ², the channel's own sampling variance and the channel model's relative error), so
  neither noise nor the model's error is fitted.

All of it reads only the DP release's noisy totals, σ and public data (the embedding, the
mechanism, ε, the public corpus): post-processing, so the release's guarantee is unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from scipy import special

from lac.common.files import atomic_file, private_dir
from lac.common.text import BOS, EOS, UNK, sentences
from lac.curator.base.ngrams import NgramVocabulary

log = logging.getLogger(__name__)

__all__ = [
    "WordChannel",
    "NgramChannel",
    "Deconvolution",
    "deconvolve",
    "deconvolve_steps",
    "EMStart",
    "item_estimate",
    "stands_out",
    "ITEM_FALSE_ALARM",
    "word_channel",
    "deployment_channel",
    "CHANNEL_DRAWS",
    "MIN_DRAWS",
    "channel_draws",
    "MIN_KEEP_SHARE",
    "MODEL_ERROR",
]

# The channel model's own relative error on real text: from the clean totals of 20k real users it predicts their
# perturbed unigram totals to within a median 8.8%, mass-weighted 5.3% (benchmarks/channel_error.py, ε = 8 over
# GloVe 50k; with 400 draws for the words carrying half the text and ∝ √count below it was 19% and 11%), about what
# the users' own random choices leave (a median 8.9% at 20k users); a fit closer than that chases the model's error.
MODEL_ERROR = 0.08
MAX_ITERATIONS = 50
# Where the deconvolution's EM starts: the public prior π, or the item-wise estimate (``item_estimate``).
EMStart = Literal["prior", "items"]
# The chance that the item-wise start reads any item of an order whose noisy totals are the channel's prediction plus
# DP noise alone (``stands_out``): the reading divides an item's total by its keep rate (below 1% for rare trigrams),
# with none of the EM's early stop to hold it, and one noise spike read that way topped a demo's trigrams.
ITEM_FALSE_ALARM = 0.01
MIN_KEEP_SHARE = 0.25  # below: the channel keeps too few words for a clean estimate (see NgramChannel.informative)
# Monte-Carlo perturbations per word of the word list on average (the <unk> row's share included), shared by
# public frequency: the predicted perturbed total of an output word is Σ_w x_w P(out | w), whose sampling
# variance Σ_w x_w² P(1−P)/n_w is smallest for n_w ∝ x_w; a word's own relative error, weighted by its
# frequency, is smallest for n_w ∝ √x_w. Measured on 20k real users at ε = 8 over GloVe 50k
# (benchmarks/channel_error.py): median error of the predicted unigram totals 19% with 400 draws for the words
# carrying half the text and ∝ √count below (1.40M perturbations); 8.8% with 0.88M shared as ``channel_draws`` does
# (8.7% with 1.13M: the word channel's time, 54 s on two cores, buys little more accuracy above this).
CHANNEL_DRAWS = 55
MIN_DRAWS = 30  # ... and never fewer for one word: its row's standard error ≤ 0.5/√30 ≈ 0.091
_FORMAT = 2
COUNT_SHARE = 0.5  # of the draws above the floor: shared ∝ count; the rest ∝ √count (channel_draws)
_ALLOCATION = f"count{COUNT_SHARE}"  # how the draws are shared (in the cache file's name: no other file is reused)


@dataclass(frozen=True, eq=False)
class WordChannel:
    """P(output class | clean class) over ``classes`` (CSR rows summing to 1), for one deployment.

    ``draws``: the Monte-Carlo draws per word on average it was sampled with (``channel_draws``);
    ``row_draws``: each class's draws (0 for the exact ``<s>``/``</s>`` rows), or None when every word had
    ``draws``."""

    classes: tuple[str, ...]
    matrix: sp.csr_matrix
    draws: int
    deployment_key: str  # embedding, mechanism, ε per word and word list this channel was sampled for
    row_draws: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.matrix.shape != (len(self.classes), len(self.classes)):
            raise ValueError(f"channel matrix {self.matrix.shape} for {len(self.classes)} classes")
        if self.row_draws is not None and np.shape(self.row_draws) != (len(self.classes),):
            raise ValueError(f"row_draws of shape {np.shape(self.row_draws)} for {len(self.classes)} classes")

    @property
    def least_draws(self) -> int:
        """The fewest draws of any word's row."""
        if self.row_draws is None:
            return self.draws
        sampled = self.row_draws[self.row_draws > 0]
        return int(sampled.min()) if sampled.size else self.draws

    @property
    def standard_error(self) -> float:
        """Upper bound of the Monte-Carlo standard error of any ordinary word's probability (0.5/√draws of the
        row with the fewest draws; ``row_standard_error`` per row)."""
        return 0.5 / math.sqrt(self.least_draws)

    def row_standard_error(self) -> np.ndarray:
        """Per class, the bound 0.5/√draws of the Monte-Carlo standard error of each of its row's entries
        (0 for the exact rows)."""
        d = np.full(len(self.classes), self.draws) if self.row_draws is None else self.row_draws
        return np.divide(0.5, np.sqrt(d), out=np.zeros(d.shape), where=d > 0)

    def describe(self) -> str:
        """How it was sampled and its error bound, for a release's statement."""
        if self.row_draws is None or self.least_draws == self.draws:
            return f"{self.draws} draws per word, standard error ≤ {self.standard_error:.3g}"
        most = int(self.row_draws.max())
        return (
            f"{self.least_draws}–{most} draws per word ({self.draws} on average, shared by public frequency), "
            f"standard error ≤ 0.5/√draws per row: {0.5 / math.sqrt(most):.3g} to {self.standard_error:.3g}"
        )

    def keep_rate(self) -> np.ndarray:
        """P(a clean word comes out as itself), per class."""
        return np.asarray(self.matrix.diagonal())

    def save(self, path: Path) -> None:
        """Write ``path`` (.npz) atomically."""
        m = self.matrix.tocsr()
        with atomic_file(path) as f:
            np.savez_compressed(
                f,
                format=np.int64(_FORMAT),
                classes=np.frombuffer("\n".join(self.classes).encode("utf-8"), dtype=np.uint8),
                indptr=m.indptr,
                indices=m.indices,
                data=m.data,
                draws=np.int64(self.draws),
                key=np.frombuffer(self.deployment_key.encode("utf-8"), dtype=np.uint8),
                row_draws=np.empty(0, np.int64) if self.row_draws is None else self.row_draws,
            )

    @classmethod
    def load(cls, path: Path) -> WordChannel:
        with np.load(path, allow_pickle=False) as z:
            if int(z["format"]) not in (1, _FORMAT):  # 1: before row_draws (every word had ``draws``)
                raise ValueError(f"{path}: unsupported channel format {int(z['format'])}")
            classes = tuple(z["classes"].tobytes().decode("utf-8").split("\n"))
            n = len(classes)
            m = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=(n, n))
            rows = z["row_draws"] if "row_draws" in z and z["row_draws"].size else None
            return cls(classes, m, int(z["draws"]), z["key"].tobytes().decode("utf-8"), rows)


def deployment_key(embedding: str, mechanism: str, epsilon_per_word: float, vocab: NgramVocabulary) -> str:
    """What a word channel depends on: the deployment's embedding, mechanism and ε per word, and
    the release vocabulary's word list (a digest)."""
    words = "\n".join(sorted(vocab.words)).encode("utf-8")
    digest = hashlib.sha256(words).hexdigest()[:16]
    return f"{embedding}|{mechanism}|{epsilon_per_word!r}|words:{digest}"


def _classes(vocab: NgramVocabulary) -> tuple[str, ...]:
    """Every token of the vocabulary's items, ``<s>`` and ``</s>`` included (sorted: a stable order)."""
    tokens = {t for it in vocab.items for t in it.split(" ")}
    return tuple(sorted(tokens | {BOS, EOS, UNK}))


def channel_draws(counts: np.ndarray, mean: int = CHANNEL_DRAWS, least: int = MIN_DRAWS) -> np.ndarray:
    """Monte-Carlo draws per word from its public ``counts``: ``mean`` draws per word on average, ``least`` each
    and the rest shared ``COUNT_SHARE`` in proportion to the counts (what the predicted totals need) and the
    remainder in proportion to their square roots (what each word's own relative error needs), rounded up.
    ``least >= mean`` or no counts: ``mean`` each. Public data only."""
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    if least >= mean or c.sum() <= 0:
        return np.full(c.size, mean, dtype=np.int64)
    rest = float(mean - least) * c.size
    root = np.sqrt(c)
    share = COUNT_SHARE * c / c.sum() + (1.0 - COUNT_SHARE) * root / root.sum()
    return (least + np.ceil(rest * share)).astype(np.int64)


def word_channel(
    vocab: NgramVocabulary,
    embedding,
    mechanism,
    unk_words: Iterable[str] = (),
    draws: int = CHANNEL_DRAWS,
    rng=None,
    progress: Callable[[int, int], None] | None = None,
    min_draws: int = MIN_DRAWS,
) -> WordChannel:
    """Sample the word channel of ``mechanism`` over ``embedding`` (``lac.client`` objects) for
    ``vocab``'s word classes, each word (and the clean ``<unk>``) with ``channel_draws`` of its public
    count (``draws`` on average, at least ``min_draws``; ``min_draws >= draws``: ``draws`` for each).
    ``unk_words``: public word occurrences outside the word list (the public corpus's rare words), whose
    mixture is the clean ``<unk>`` row; without them
    ``<unk>`` is perturbed from the centroid like an out-of-vocabulary word. ``progress(done, total)``:
    perturbations sampled so far. The default ``rng`` is numpy's generator seeded from the OS: the channel
    is public, so its Monte-Carlo draws protect nothing and need no CSPRNG."""
    from lac.client.channel import sample_channel
    from lac.client.localizer import OOV

    classes = _classes(vocab)
    cid = {c: i for i, c in enumerate(classes)}
    n = len(classes)
    emb_index = embedding.index
    rng = np.random.default_rng() if rng is None else rng
    # output embedding row -> class (a word outside the word list is read as <unk>)
    out_class = np.array([cid[w] if w in vocab.words else cid[UNK] for w in embedding.words])
    words = sorted(vocab.words)
    uni = {vocab.items[i]: float(vocab.alpha[i]) for i in np.flatnonzero(vocab.orders == 1)}
    allotted = channel_draws(np.array([uni.get(w, 0.0) for w in [*words, UNK]]), int(draws), int(min_draws))
    word_draws, unk_n = allotted[:-1], int(allotted[-1])
    rows = np.array([emb_index.get(w, OOV) for w in words], dtype=np.int64)
    unk_rows = np.array([emb_index.get(w, OOV) for w in unk_words], dtype=np.int64)
    if unk_rows.size:
        pick = np.random.default_rng(0).integers(0, unk_rows.size, size=unk_n)  # a fixed public sample
        unk_inputs = unk_rows[pick]
    else:
        unk_inputs = np.full(unk_n, OOV, dtype=np.int64)
    # one sampling pass over the words (rows of words read as one embedding row share the most draws any asks)
    distinct, inverse = np.unique(rows, return_inverse=True)
    distinct_draws = np.zeros(distinct.size, dtype=np.int64)
    np.maximum.at(distinct_draws, inverse, word_draws)
    total = int(distinct_draws.sum()) + unk_n
    report = None if progress is None else (lambda done, _total: progress(done, total))
    counts = sample_channel(embedding, mechanism, distinct, distinct_draws, rng, report)
    unk_counts = sample_channel(embedding, mechanism, unk_inputs, 1, rng)
    if progress is not None:
        progress(total, total)
    src = np.repeat(np.arange(distinct.size), np.diff(counts.indptr))
    per_row = sp.csr_matrix(
        (counts.counts / distinct_draws[src], (src, out_class[counts.cols])),
        shape=(distinct.size, n),
        dtype=np.float64,
    )
    unk_row = np.bincount(out_class[unk_counts.cols], weights=unk_counts.counts, minlength=n) / unk_n
    word_ids = np.array([cid[w] for w in words], dtype=np.int64)
    perm = sp.csr_matrix((np.ones(len(words)), (word_ids, np.arange(len(words)))), shape=(n, len(words)))
    P = (perm @ per_row[inverse]).tolil()  # one row per word of the word list, at its class
    P[cid[UNK]] = unk_row
    for t in (BOS, EOS):
        P[cid[t], cid[t]] = 1.0
    row_draws = np.zeros(n, dtype=np.int64)
    row_draws[word_ids] = distinct_draws[inverse]
    row_draws[cid[UNK]] = unk_n
    key = deployment_key(embedding.name, mechanism.name, float(mechanism.epsilon), vocab)
    return WordChannel(classes, P.tocsr(), int(draws), key, row_draws)


def cached_word_channel(
    cache_dir: Path,
    vocab: NgramVocabulary,
    embedding_name: str,
    mechanism_name: str,
    epsilon_per_word: float,
    unk_words: Callable[[], Sequence[str]],
    draws: int = CHANNEL_DRAWS,
    progress: Callable[[int, int], None] | None = None,
    min_draws: int = MIN_DRAWS,
) -> WordChannel:
    """The word channel of a deployment, sampled once and cached in ``cache_dir`` (needs
    ``lac-client`` with the deployment's embedding the first time); ``progress`` as for ``word_channel``,
    never called when the cache has it."""
    path = word_channel_path(cache_dir, vocab, embedding_name, mechanism_name, epsilon_per_word, draws, min_draws)
    key = deployment_key(embedding_name, mechanism_name, float(epsilon_per_word), vocab)
    if path.exists():
        try:
            ch = WordChannel.load(path)
            if ch.deployment_key == key and ch.draws == draws:  # (the path names min_draws)
                return ch
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # unreadable: sampled again below
            log.warning("the cached word channel %s is unreadable (%s); sampling it again", path, exc)
    from lac.client.embedding import by_name
    from lac.client.mechanisms import MultivariateLaplace

    if mechanism_name != MultivariateLaplace.name:
        raise ValueError(f"no channel model for local mechanism {mechanism_name!r}")
    embedding = by_name(embedding_name)
    log.info("sampling the local channel for %s (%d words x %d draws on average)", key, len(vocab.words), draws)
    mechanism = MultivariateLaplace(epsilon_per_word)
    ch = word_channel(vocab, embedding, mechanism, unk_words(), draws, progress=progress, min_draws=min_draws)
    private_dir(cache_dir)
    ch.save(path)
    return ch


def word_channel_path(
    cache_dir: Path,
    vocab: NgramVocabulary,
    embedding_name: str,
    mechanism_name: str,
    epsilon_per_word: float,
    draws: int = CHANNEL_DRAWS,
    min_draws: int = MIN_DRAWS,
) -> Path:
    """Where ``cached_word_channel`` keeps a deployment's word channel in ``cache_dir``."""
    key = deployment_key(embedding_name, mechanism_name, float(epsilon_per_word), vocab)
    digest = hashlib.sha256(f"{key}|{draws}|{min(draws, min_draws)}|{_FORMAT}|{_ALLOCATION}".encode()).hexdigest()[:16]
    return cache_dir / f"channel-{digest}.npz"


def deployment_channel(
    cache_dir: Path,
    vocab: NgramVocabulary,
    public_corpus: Path,
    embedding_name: str,
    mechanism_name: str,
    epsilon_per_word: float,
    draws: int = CHANNEL_DRAWS,
    progress: Callable[[int, int], None] | None = None,
    min_draws: int = MIN_DRAWS,
) -> NgramChannel:
    """The n-gram channel of a deployment over ``vocab``: its word channel (sampled once, cached in
    ``cache_dir``, the clean ``<unk>`` row from ``public_corpus``'s rare words) in products."""
    word = cached_word_channel(
        cache_dir,
        vocab,
        embedding_name,
        mechanism_name,
        epsilon_per_word,
        lambda: public_unk_words(sentences(public_corpus.read_text(encoding="utf-8")), vocab),
        draws,
        progress,
        min_draws,
    )
    return NgramChannel.cached(cache_dir, word, vocab)


def public_unk_words(sentences: Iterable[Sequence[str]], vocab: NgramVocabulary) -> list[str]:
    """The public corpus's word occurrences outside ``vocab``'s word list (what clean ``<unk>`` stands for)."""
    words = vocab.words
    c = Counter(w for s in sentences for w in s if w not in words)
    return [w for w, k in c.items() for _ in range(k)]


@dataclass(frozen=True, eq=False)
class NgramChannel:
    """Per order n, A_n[j', j] = P(clean public n-gram j is counted as public n-gram j') =
    Πₜ P(j'ₜ | jₜ), exact over the word channel, over the release vocabulary's columns of that
    order (``columns[n]``)."""

    word: WordChannel
    columns: dict[int, np.ndarray]
    matrices: dict[int, sp.csr_matrix]
    keep: float = 0.0  # the public text's share of words the devices leave unchanged: Σ_w π_w P(w → w)

    @classmethod
    def build(cls, word: WordChannel, vocab: NgramVocabulary, block: int = 1 << 22) -> NgramChannel:
        """A_n for every order of ``vocab``. Order 1 is the word channel itself, read at the unigrams' classes
        (sparse). Longer orders: for each position, the word channel's dense block between the tokens used
        there; a block of clean items at a time (about ``block`` pairs), the first position's non-zero pairs,
        multiplied by the other positions' factors at those pairs (the same products, in the same order)."""
        cid = {c: i for i, c in enumerate(word.classes)}
        P = word.matrix.tocsr()
        columns, matrices = {}, {}
        orders = vocab.orders
        for n in np.unique(orders).tolist():
            cols = np.flatnonzero(orders == n)
            toks = np.array([[cid.get(t, cid[UNK]) for t in vocab.items[c].split(" ")] for c in cols], dtype=np.int64)
            if n == 1:  # A_1[j', j] = P(j' | j)
                columns[n], matrices[n] = cols, P[toks[:, 0]][:, toks[:, 0]].T.tocsr()
                continue
            dense, local = [], []
            for t in range(n):
                used, inv = np.unique(toks[:, t], return_inverse=True)
                dense.append(P[used][:, used].toarray())
                local.append(inv.reshape(-1))
            step = max(1, block // max(cols.size, 1))
            rows_i, cols_j, vals = [], [], []
            for lo in range(0, cols.size, step):
                hi = min(lo + step, cols.size)
                first = dense[0][np.ix_(local[0][lo:hi], local[0])]
                c, r = np.nonzero(first)  # c: clean item (within the block), r: observed item
                prod = first[c, r]
                for t in range(1, n):
                    prod *= dense[t][local[t][lo + c], local[t][r]]
                nz = np.flatnonzero(prod)
                rows_i.append(r[nz])
                cols_j.append(lo + c[nz])
                vals.append(prod[nz])
            A = sp.csr_matrix(
                (np.concatenate(vals), (np.concatenate(rows_i), np.concatenate(cols_j))), shape=(cols.size, cols.size)
            )
            columns[n], matrices[n] = cols, A
        uni = np.flatnonzero(orders == 1)
        alpha = vocab.alpha[uni]
        keep = float((matrices[1].diagonal() * alpha).sum() / alpha.sum()) if 1 in matrices and alpha.sum() > 0 else 0.0
        return cls(word, columns, matrices, keep)

    @classmethod
    def cached(cls, cache_dir: Path, word: WordChannel, vocab: NgramVocabulary) -> NgramChannel:
        """``build``, read from ``cache_dir`` when built before for this word channel (its content, not
        only its deployment) and this vocabulary: the products take a curator ~20 s at each start."""
        digest = hashlib.sha256()
        for part in (word.deployment_key, str(word.draws), "\n".join(word.classes), "\n".join(vocab.items)):
            digest.update(part.encode("utf-8") + b"\0")
        for a in (word.matrix.indptr, word.matrix.indices, word.matrix.data, vocab.orders, vocab.alpha):
            digest.update(np.ascontiguousarray(a).tobytes() + b"\0")
        key = digest.hexdigest()
        path = cache_dir / f"ngram-channel-{key[:16]}.npz"
        if path.exists():
            try:
                return cls._load(path, word, key)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # unreadable: built again below
                log.warning("the cached n-gram channel %s is unreadable (%s); building it again", path, exc)
        channel = cls.build(word, vocab)
        private_dir(cache_dir)
        channel.save(path, key)
        return channel

    def save(self, path: Path, key: str) -> None:
        """Write this channel to ``path`` under the cache ``key`` (by a temporary name, then renamed)."""
        arrays: dict[str, Any] = {}  # Any: numpy's stub types savez's keywords as its own options
        for n, cols in self.columns.items():
            m = self.matrices[n].tocsr()
            arrays |= {f"columns{n}": cols, f"indptr{n}": m.indptr, f"indices{n}": m.indices, f"data{n}": m.data}
        with atomic_file(path) as f:
            np.savez(
                f,
                format=np.int64(_FORMAT),
                key=np.frombuffer(key.encode("ascii"), dtype=np.uint8),
                keep=np.float64(self.keep),
                orders=np.array(sorted(self.columns), dtype=np.int64),
                **arrays,
            )

    @classmethod
    def _load(cls, path: Path, word: WordChannel, key: str) -> NgramChannel:
        with np.load(path, allow_pickle=False) as z:
            if int(z["format"]) != _FORMAT or z["key"].tobytes().decode("ascii") != key:
                raise ValueError("another format or channel")
            columns, matrices = {}, {}
            for n in z["orders"].tolist():
                cols = z[f"columns{n}"]
                columns[n] = cols
                matrices[n] = sp.csr_matrix(
                    (z[f"data{n}"], z[f"indices{n}"], z[f"indptr{n}"]), shape=(cols.size, cols.size)
                )
            return cls(word, columns, matrices, float(z["keep"]))

    @property
    def informative(self) -> bool:
        """Whether the devices keep enough words (``keep`` ≥ ``MIN_KEEP_SHARE``) for the users' clean
        statistics to be estimated from their reports. Public: it depends on the deployment
        only. Measured end to end (``lac eval e2e``): at the private preset (ε = 5 per word over GloVe
        50k, keep share 0.13) every estimate from the reports lost to the public prior with 200k
        users; at the balanced preset (0.40) the clean estimate beat it by 24%."""
        return self.keep >= MIN_KEEP_SHARE

    def order(self, n: int, vocab: NgramVocabulary) -> sp.csr_matrix:
        """A_n, after checking that this channel was built over ``vocab``'s order-n items."""
        cols = np.flatnonzero(vocab.orders == n)
        if n not in self.matrices or not np.array_equal(self.columns[n], cols):
            raise ValueError(f"this channel was built for another release vocabulary (order {n})")
        return self.matrices[n]


@dataclass(frozen=True)
class Deconvolution:
    """A deconvolved estimate of clean totals, where its EM started and how the fit stopped."""

    clean: np.ndarray
    iterations: int
    discrepancy: float  # Σ (observed − A x)² / variance, per observed cell, at the end (≈ 1: fitted to the noise)
    start_discrepancy: float  # the same at the starting point
    start: EMStart = "prior"


def item_estimate(y: np.ndarray, A: sp.csr_matrix, prior: np.ndarray) -> np.ndarray:
    """Clean totals read off observed totals ``y`` item by item: yⱼ·πⱼ/(Aπ)ⱼ, the share of item j's observed total
    that the public ``prior`` π says stayed j (Aⱼⱼπⱼ/(Aπ)ⱼ by Bayes' rule), over its keep rate Aⱼⱼ. One EM step from
    the prior spreads every observed total back over all the items that could have become it, which blurs where
    the channel mostly keeps words; this does not. ``y``: (items,) or (items, draws)."""
    pushed = A @ prior
    ratio = np.divide(prior, pushed, out=np.zeros_like(pushed, dtype=np.float64), where=pushed > 0)
    return y * ratio.reshape(-1, *([1] * (np.ndim(y) - 1))).astype(np.result_type(y), copy=False)


def stands_out(
    observed: np.ndarray, A: sp.csr_matrix, prior: np.ndarray, sigma: float, false_alarm: float = ITEM_FALSE_ALARM
) -> np.ndarray:
    """The items whose noisy total (``observed``, (items,) or (items, draws)) stands out of the DP noise (σ =
    ``sigma``) around what the public ``prior`` pushed through the channel predicts at the observed mass: μⱼ =
    sⱼ·Σ observed, sⱼ = (Aπ)ⱼ/Σ(Aπ). Where every total is c·(Aπ)ⱼ plus noise (any c), observedⱼ − μⱼ is normal with
    standard deviation σ·√((1 − sⱼ)² + sⱼ²·(items − 1)); an item stands out beyond z of those, z the two-sided normal
    quantile at ``false_alarm``/items, so that there any item stands out with probability at most ``false_alarm``
    (Bonferroni)."""
    obs = np.asarray(observed, dtype=np.float64)
    pushed = np.asarray(A @ prior, dtype=np.float64)
    share = (pushed / max(float(pushed.sum()), np.finfo(float).tiny)).reshape(-1, *([1] * (obs.ndim - 1)))
    items = max(obs.shape[0], 1)
    spread = sigma * np.sqrt((1.0 - share) ** 2 + share**2 * (items - 1))
    z = -float(special.ndtri(false_alarm / (2 * items)))
    return np.abs(obs - share * obs.sum(axis=0)) > z * spread


def _start(
    kind: EMStart,
    y: np.ndarray,
    A: sp.csr_matrix,
    prior: np.ndarray,
    observed: np.ndarray | None = None,
    sigma: float = 0.0,
) -> np.ndarray:
    """The EM's starting point of ``kind``, scaled so that its fit A·x has the mass of ``y`` (per column). The
    item-wise start reads only the items whose ``observed`` (noisy) totals stand out of the noise σ = ``sigma``
    (``stands_out``); the others start at the prior's composition, as from the prior."""
    if kind == "prior":
        x = np.multiply.outer(prior, np.ones(y.shape[1:]))
    elif observed is None:
        raise ValueError("the item-wise start needs the observed (noisy) totals and their σ")
    else:
        pushed = np.asarray(A @ prior, dtype=np.float64)
        at_prior = np.multiply.outer(pushed, y.sum(axis=0) / max(float(pushed.sum()), np.finfo(float).tiny))
        x = item_estimate(np.where(stands_out(observed, A, prior, sigma), y, at_prior), A, prior)
    fitted = (A @ x).sum(axis=0)
    scale = np.divide(y.sum(axis=0), fitted, out=np.zeros_like(np.asarray(fitted, dtype=np.float64)), where=fitted > 0)
    return (x * scale).astype(y.dtype, copy=False)


def deconvolve(
    observed: np.ndarray,
    A: sp.csr_matrix,
    prior: np.ndarray,
    sigma: float,
    *,
    fit_to: np.ndarray | None = None,
    starts: Sequence[EMStart] = ("prior",),
    max_iter: int = MAX_ITERATIONS,
    target: float | None = None,
    model_error: float = MODEL_ERROR,
    occurrence_weight: float = 1.0,
) -> Deconvolution:
    """Clean totals x ≥ 0 with A x ≈ ``observed`` (noisy totals, variance σ² + κ·A x + (η·A x)² each: the DP
    noise, the devices' own random choices (Poisson, each occurrence counted with weight κ =
    ``occurrence_weight``: 1 for raw counts, 1/‖c‖₂ of its report for normalised ones) and η = ``model_error``,
    the channel model's own relative error).

    Started at whichever of ``starts`` fits ``observed`` best (the public ``prior``; ``"items"``: the item-wise
    estimate of the fitted values, ``item_estimate``, a candidate only where those are denoised, or it would follow
    the noise, and read only for items whose observed totals stand out of the noise, ``stands_out``), scaled to the
    observed mass; each step is the EM update of
    Poisson deconvolution with censoring (mass that leaves the observed cells is accounted for by
    each clean item's detection probability Σ_j' A[j', j]); stops once the mean discrepancy
    Σ (observed − A x)²/variance / |cells| is at most ``target`` (the discrepancy principle; default
    1 + 2·√(2/|cells|), within two standard deviations of what noise alone gives),
    or stops improving, or after ``max_iter`` steps. ``fit_to``: the non-negative values the EM
    fits (default max(observed, 0)), e.g. a denoised version of ``observed``; the discrepancy is
    always measured against ``observed``."""
    obs = np.asarray(observed, dtype=np.float64)
    if target is None:
        target = 1.0 + 2.0 * math.sqrt(2.0 / max(obs.size, 1))
    y = np.maximum(np.asarray(observed if fit_to is None else fit_to, dtype=np.float64), 0.0)
    detect = np.asarray(A.sum(axis=0)).ravel()
    AT = A.T.tocsr()
    p = np.asarray(prior, dtype=np.float64)
    # the starting mass: the noisy total (unbiased; max(observed, 0) is inflated where noise dominates)
    at_mass = y if fit_to is not None or obs.sum() <= 0 else y * (obs.sum() / max(y.sum(), np.finfo(float).tiny))
    s2 = sigma * sigma

    def disc(fit: np.ndarray) -> float:
        f = np.maximum(fit, 0.0)
        return float(np.mean((obs - fit) ** 2 / (s2 + occurrence_weight * f + (model_error * f) ** 2)))

    candidates = []
    for kind in starts:
        x0 = _start(kind, at_mass, A, p, obs, sigma)
        fit0 = A @ x0
        candidates.append((disc(fit0), kind, x0, fit0))
    d0, start, x, fit = min(candidates, key=lambda c: c[0])  # ties: the first named
    d = d0
    it = 0
    while it < max_iter and d > target:
        nxt, nfit = _em_step(x, y, fit, A, AT, detect)
        nd = disc(nfit)
        if nd > d * (1 - 1e-4):  # no longer improving: the rest is noise or model error
            break
        x, fit, d = nxt, nfit, nd
        it += 1
    return Deconvolution(x, it, d, d0, start)


def _em_step(
    x: np.ndarray, y: np.ndarray, fit: np.ndarray, A: sp.csr_matrix, AT: sp.csr_matrix, detect: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One EM step of ``deconvolve`` from clean totals ``x`` (fitted A·x = ``fit``) towards ``y``: the next
    x and its fit. Arrays are one estimate (n,) or several side by side (n, draws)."""
    ok = detect > 0
    ratio = np.divide(y, fit, out=np.zeros_like(y), where=fit > 0)
    nxt = x.copy()
    nxt[ok] = x[ok] * (AT @ ratio)[ok] / detect[ok].reshape(-1, *([1] * (x.ndim - 1)))
    return nxt, A @ nxt


def deconvolve_steps(
    fit_to: np.ndarray,
    A: sp.csr_matrix,
    prior: np.ndarray,
    steps: int,
    dtype: type[np.floating] = np.float64,
    start: EMStart = "prior",
    observed: np.ndarray | None = None,
    sigma: float = 0.0,
) -> np.ndarray:
    """``deconvolve(..., fit_to=fit_to)`` from ``start``, run for exactly ``steps`` EM steps (no stopping rule), for
    several targets at once: ``fit_to`` is (items, draws), one column per draw; returns the clean totals alike,
    computed in ``dtype`` (float32 halves the memory traffic of the sparse products where ~7 significant digits
    suffice). ``observed`` (items, draws) and ``sigma``: the noisy totals and their σ, which the item-wise start
    needs (``stands_out``)."""
    y = np.maximum(np.asarray(fit_to, dtype=dtype), 0.0)
    A = A.astype(dtype, copy=False)
    detect = np.asarray(A.sum(axis=0)).ravel()
    AT = A.T.tocsr()
    x = _start(start, y, A, np.asarray(prior, dtype=np.float64), observed, sigma)
    fit = A @ x
    for _ in range(steps):
        x, fit = _em_step(x, y, fit, A, AT, detect)
    return x
