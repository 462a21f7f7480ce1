"""Table 1 of Ramadan et al.: perplexity of trigram language models built from each release.

The release vocabulary here is the curator's (public n-grams of orders 1–3), since the model
(``lac.curator.lm.model.NgramModel``, interpolated Kneser–Ney) conditions trigrams on their bigram
prefixes and backs off through them; the language model is post-processing of the release and
costs no privacy. Every row's model is built by ``lac.curator.lm.model.release_model``, the builder of
the curator's queries and of offline release files: from pseudo-counts where the release has them
(exact counts, the posterior), else from the released distribution.
"""

from __future__ import annotations

import numpy as np

from lac.common.progress import Progress
from lac.common.rng import RandomSource
from lac.curator import mechanisms
from lac.curator.lm.model import NgramModel, release_model

from .config import EvalConfig
from .data import Counts, EvalData
from .mechanisms import LABELS, SPECS, release, release_of
from .metrics import summarize

PAPER = {  # Reddit, 60K n-grams (Table 1)
    "private": 29.48,
    "kanon": 35.51,
    "bayes": 35.55,
    "laplace-public": 580.46,
    "laplace": 894.32,
    "public": 43.00,
}
ROWS = (
    "private",
    "kanon",
    "posterior",
    "bayes",
    "bayes-sound",
    "endtoend",
    "laplace-public",
    "laplace-public-obs",
    "laplace",
    "public",
)


def heldout_in_vocabulary(model_words: frozenset[str], sentences: list[list[str]]) -> list[list[str]]:
    """Held-out sentences of ≥ 2 words, every word in the release's unigram vocabulary."""
    return [s for s in sentences if len(s) >= 2 and all(w in model_words for w in s)]


def trigram_coverage(items: set[str], sentences: list[list[str]]) -> tuple[int, int, int]:
    """(trigram events, events whose trigram is in the vocabulary, sentences fully covered)."""
    from lac.curator.base.ngrams import ngrams

    events = covered = full = 0
    for s in sentences:
        tri = [g for g in ngrams(s, 3) if g.count(" ") == 2]
        hit = sum(g in items for g in tri)
        events += len(tri)
        covered += hit
        full += hit == len(tri)
    return events, covered, full


def row_model(name: str, counts: Counts, eps: float, cfg: EvalConfig, rng: RandomSource, K: int) -> NgramModel:
    """The language model of row ``name`` (one release of it at ``eps``; the exact counts for
    "private"), built as the curator builds a release's model (``release_model``)."""
    vocab = counts.vocab
    if name == "private":
        c = np.asarray(counts.raw.sum(axis=0)).ravel().astype(float)
        return release_model(vocab.items, None, c, max_n=3)
    if name in SPECS:  # one release of a registered mechanism, as the curator makes it
        r = release_of(name, counts.U, vocab, eps, cfg, rng, K=K)
        return release_model(r.items, r.log_probs, r.pseudo_counts, max_n=3)
    with np.errstate(divide="ignore"):
        probs = release(name, counts.U, counts.alpha, eps, cfg, rng, K=K)
        return release_model(vocab.items, np.log(probs), max_n=3)


def run(data: EvalData) -> dict:
    """Table 1: perplexity on the held-out sentences of a language model built from each release."""
    cfg = data.config.with_overrides(W=data.config.lm_W)
    vocab = data.lm_vocab
    counts = data.counts_for_config(vocab, cfg)
    rng = np.random.default_rng(cfg.seed + 7)
    words = frozenset(it for it, o in zip(vocab.items, vocab.orders) if o == 1)
    test = heldout_in_vocabulary(words, data.heldout_sentences)
    tri_items = {it for it, o in zip(vocab.items, vocab.orders) if o == 3}
    events, covered, full = trigram_coverage(tri_items, test)
    eps, K = cfg.table_epsilon, cfg.table_k
    bar = Progress("table1 perplexity", len(ROWS))
    rows = []
    for name in ROWS:
        mechanism = mechanisms.get(SPECS[name]["mechanism"]) if name in SPECS else None
        noisy = mechanism is not None and mechanism.takes_epsilon  # else one deterministic run
        runs = cfg.table_runs if noisy else 1
        ppl = []
        for _ in range(runs):
            model = row_model(name, counts, eps, cfg, rng, K)
            ppl.append(model.perplexity(test))
        bar.update()
        label = LABELS[name][0] + (f", ε = {eps:g}" if noisy else "")
        if mechanism is not None and "K" in mechanism.knobs:
            label += f", K = {K}"
        rows.append(
            {
                "mechanism": name,
                "label": label,
                "privacy": LABELS[name][1],
                "perplexity": summarize(ppl),
                "paper": PAPER.get(name),
            }
        )
    bar.close()
    return {
        "rows": rows,
        "vocab_size": len(vocab),
        "W": cfg.W,
        "test_sentences": len(test),
        "test_words": sum(map(len, test)),
        "heldout_sentences": len(data.heldout_sentences),
        "trigram_events": events,
        "trigram_events_covered": covered,
        "sentences_fully_covered": full,
        "train_users": counts.U.shape[0],
    }
