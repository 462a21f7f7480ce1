"""The public prior: n-gram counts α from a public corpus, which also fix the release vocabulary.

The word list is closed on the public corpus: words seen fewer than ``min_count`` times there
are read as ``<unk>`` (in the corpus and in reports alike), so the ``<unk>`` unigram and the
n-grams with ``<unk>`` carry the mass of rare words. Private n-grams outside the public set are
released only through DP discovery (``lac.curator.release.posterior``), never by construction.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from lac.common.files import private_dir
from lac.common.paths import data_dir
from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary

log = logging.getLogger(__name__)


def default_public_corpus() -> Path:
    """Where ``lac data`` puts the public corpus: ``data_dir()/corpora/public.txt``."""
    return data_dir() / "corpora" / "public.txt"


def public_vocabulary(
    corpus: Path | None, max_n: int, min_count: int, max_items: int, cache_dir: Path
) -> NgramVocabulary:
    """Build (or load the cached) release vocabulary and prior counts from ``corpus``."""
    corpus = corpus or default_public_corpus()
    if not corpus.exists():
        raise FileNotFoundError(f"public corpus {corpus} not found: run `lac data` or pass --public-corpus FILE")
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:16]
    cache = cache_dir / f"vocab-{digest}-n{max_n}-m{min_count}-k{max_items}-unk.npz"
    if cache.exists():
        return NgramVocabulary.load(cache)
    log.info("building the public n-gram prior from %s", corpus)
    vocab = NgramVocabulary.from_sentences(
        sentences(corpus.read_text(encoding="utf-8")),
        max_n=max_n,
        min_count=min_count,
        max_items=max_items,
        unknown_words=True,
    )
    private_dir(cache_dir)
    tmp = cache.with_suffix(".tmp.npz")
    vocab.save(tmp)
    tmp.replace(cache)
    return vocab
