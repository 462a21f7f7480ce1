"""NgramProbabilities, NextWord, Perplexity, TopNgrams and ExportArpa: free queries on a release (post-processing
of its DP outputs and public data only), through a cache of the newest releases' models."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lac.common.errors import InvalidArgument
from lac.common.privacy import ERROR_BAR_LEVEL
from lac.common.text import BOS, EOS, UNK
from lac.common.text import sentences as split_sentences
from lac.curator.lm.model import NgramModel, release_model
from lac.curator.service.handlers.release import get_release

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState

# Per-call limits of the queries (INVALID_ARGUMENT beyond them).
MAX_QUERY_NGRAMS = 10_000  # n-grams in one NgramProbabilities call
MAX_QUERY_TEXT_CHARS = 1_000_000  # characters of a Perplexity text
MAX_CONTEXT_CHARS = 10_000  # characters of a NextWord context
_SPECIAL_TOKENS = frozenset({BOS, EOS, UNK})  # what TopNgrams' exclude_special leaves out


@dataclass(frozen=True)
class TopNgrams:
    """(n-gram, probability, standard deviation, low, high) rows, the intervals' coverage and what they describe."""

    rows: tuple[tuple[str, float, float, float, float], ...]
    level: float
    described: str


@dataclass(frozen=True)
class NextWords:
    """The part of the context the model used and the most probable next words with their probabilities."""

    context_used: str
    words: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Perplexity:
    """A text's perplexity under a release's model, with what it was computed over."""

    perplexity: float
    n_sentences: int
    n_tokens: int
    n_out_of_vocabulary: int


async def model(state: CuratorState, release_id: str) -> NgramModel:
    """The n-gram model of a release (the newest four are kept)."""
    async with state.model_lock:
        if release_id in state.models:
            state.models.move_to_end(release_id)
            return state.models[release_id]
        r = await get_release(state, release_id)
        max_n = r.record.max_n or state.vocab.max_n
        m = await asyncio.to_thread(release_model, r.items, r.log_probs, r.pseudo_counts, max_n)  # the one builder
        state.models[release_id] = m
        while len(state.models) > 4:
            state.models.popitem(last=False)
        return m


async def top_ngrams(
    state: CuratorState,
    release_id: str,
    k: int,
    order: int,
    exclude_special: bool = False,
    level: float = ERROR_BAR_LEVEL,
) -> TopNgrams:
    """The ``k`` (>= 1) most probable n-grams of a release, most probable first: of order ``order``
    (0 = any) with probabilities renormalised within it, without those holding a special token
    (``<unk>``, ``<s>``, ``</s>``) if ``exclude_special`` (the others keep their probabilities); each with
    its error bar on the probability's scale (``lac.curator.release.errorbars``, stored with the release):
    (n-gram, probability, standard deviation, low, high) of the interval at ``level``; NaN where the
    release has none (not DP, or made before releases had them). Also what the error bars describe (its
    record's statement of them; empty for a release made before releases had them)."""
    if k < 1:
        raise InvalidArgument(f"k must be at least 1 (how many n-grams to list), got {k}")
    found = await get_release(state, release_id)
    record, items, log_probs, errors = found.record, found.items, found.log_probs, found.errors
    if order and not 1 <= order <= record.max_n:
        raise InvalidArgument(f"order must be 0 (any) or 1..{record.max_n}, got {order}")
    probs = np.exp(log_probs)
    listed = np.ones(len(items), dtype=bool)
    if order:
        listed = np.fromiter((it.count(" ") + 1 == order for it in items), dtype=bool, count=len(items))
        if not listed.any():
            raise InvalidArgument(f"no {order}-grams in the release vocabulary")
        probs = np.where(listed, probs, 0.0)
        probs = probs / probs.sum()  # the joint within the order, as NgramModel.prob
    if exclude_special:
        listed &= np.fromiter((_SPECIAL_TOKENS.isdisjoint(it.split(" ")) for it in items), dtype=bool, count=len(items))
    candidates = np.flatnonzero(listed)  # never an n-gram of another order, even when k exceeds the order's
    k = min(k, candidates.size)
    described = errors.bars.statement() if errors is not None else ""
    if k == 0:
        return TopNgrams((), level, described)
    top = candidates[np.argpartition(-probs[candidates], k - 1)[:k]]
    top = top[np.argsort(-probs[top], kind="stable")]
    if errors is None:
        sd = low = high = np.full(k, math.nan)
    else:
        sd, low, high = errors.at(top, level, within_order=bool(order))
    rows = tuple(
        (items[i], float(probs[i]), float(s), float(lo), float(hi))
        for i, s, lo, hi in zip(top, sd, low, high, strict=True)
    )
    return TopNgrams(rows, level, described)


async def ngram_probabilities(state: CuratorState, release_id: str, ngrams: list[str]) -> list[tuple[str, float]]:
    """Each n-gram (its tokens joined by one space) with its probability under the release's model."""
    if len(ngrams) > MAX_QUERY_NGRAMS:
        raise InvalidArgument(f"{len(ngrams)} n-grams in one call; at most {MAX_QUERY_NGRAMS}")
    m = await model(state, release_id)
    if not ngrams:
        raise InvalidArgument("give at least one n-gram")
    out = []
    for g in ngrams:
        n = len(g.split())
        if not 1 <= n <= m.max_n:
            raise InvalidArgument(f"n-gram {g[:80]!r}: must have 1..{m.max_n} tokens")
        out.append((" ".join(g.split()), m.prob(g)))
    return out


async def next_word(state: CuratorState, release_id: str, context: str, k: int) -> NextWords:
    """The ``k`` (0: 10) most probable words after ``context`` and the part of the context the model used."""
    if len(context) > MAX_CONTEXT_CHARS:
        raise InvalidArgument(f"a context of {len(context)} characters; at most {MAX_CONTEXT_CHARS}")
    m = await model(state, release_id)
    return NextWords(" ".join(m.context_used(context)), tuple(m.next_word(context, k or 10)))


async def perplexity(state: CuratorState, release_id: str, text: str) -> Perplexity:
    """The perplexity of ``text`` under the release's model, with its sentence, token and out-of-vocabulary counts."""
    if len(text) > MAX_QUERY_TEXT_CHARS:
        raise InvalidArgument(
            f"a text of {len(text)} characters; at most {MAX_QUERY_TEXT_CHARS} per call "
            f"(split it, and combine the perplexities weighted by their token counts)"
        )
    m = await model(state, release_id)
    sents = split_sentences(text)
    if not sents:
        raise InvalidArgument("the text has no words")
    n_tokens = sum(len(s) + 1 for s in sents)
    oov = sum(w not in m.vocabulary for s in sents for w in s)
    return Perplexity(await asyncio.to_thread(m.perplexity, sents), len(sents), n_tokens, oov)


async def arpa(state: CuratorState, release_id: str) -> str:
    """The release's model in the ARPA back-off format."""
    m = await model(state, release_id)
    return await asyncio.to_thread(m.arpa)
