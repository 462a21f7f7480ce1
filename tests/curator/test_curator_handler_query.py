"""The query handlers (``lac.curator.service.handlers.query``: TopNgrams, NgramProbabilities, NextWord, Perplexity,
ExportArpa) over a curator's state and one stored release, without gRPC: post-processing of the release only, with
their per-call limits."""

from __future__ import annotations

import math

import pytest
from curator_testkit import ingest_batch, on_state

from lac.common.errors import InvalidArgument
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.service.handlers import ingest, query, release

SENTENCES = [["the", "dog", "sleeps", "in", "the", "sun"], ["we", "walk", "the", "dog", "every", "day"]] * 5


async def _released(state) -> str:
    await ingest.ingest(state, ingest_batch(SENTENCES))
    return (await release.release(state, ReleaseSpec(epsilon=2.0, mechanism="laplace", force=True))).release_id


def test_queries_answer_from_the_release(tmp_path, public_corpus):
    async def run(state):
        rid = await _released(state)
        return (
            await query.top_ngrams(state, rid, 5, 1),
            await query.ngram_probabilities(state, rid, ["the  dog", "dog"]),
            await query.next_word(state, rid, "we walk the", 3),
            await query.perplexity(state, rid, "The dog sleeps. We walk."),
            await query.arpa(state, rid),
        )

    top, probs, nxt, ppl, arpa = on_state(tmp_path, public_corpus, run)
    assert len(top.rows) == 5 and top.level == pytest.approx(0.9)
    assert all(" " not in g for g, *_ in top.rows)  # order 1: unigrams only
    values = [p for _, p, *_ in top.rows]
    assert values == sorted(values, reverse=True) and math.fsum(values) <= 1.0 + 1e-12
    assert all(lo <= p <= hi for _, p, _, lo, hi in top.rows) and top.described.startswith("Error bars")
    assert [g for g, _ in probs] == ["the dog", "dog"] and all(0 < p <= 1 for _, p in probs)
    assert nxt.context_used == "walk the" and 1 <= len(nxt.words) <= 3  # the model's order: 3
    assert all(0 < p <= 1 for _, p in nxt.words) and [p for _, p in nxt.words] == sorted(
        (p for _, p in nxt.words), reverse=True
    )
    assert ppl.n_sentences == 2 and ppl.n_tokens == 7 and ppl.perplexity > 1
    assert arpa.startswith("\n\\data\\") or arpa.startswith("\\data\\")


def test_queries_beyond_their_limits_are_refused(tmp_path, public_corpus):
    async def run(state):
        rid = await _released(state)
        calls = [
            query.top_ngrams(state, rid, 0, 0),
            query.top_ngrams(state, rid, 5, 9),
            query.ngram_probabilities(state, rid, ["the"] * (query.MAX_QUERY_NGRAMS + 1)),
            query.ngram_probabilities(state, rid, []),
            query.next_word(state, rid, "x" * (query.MAX_CONTEXT_CHARS + 1), 3),
            query.perplexity(state, rid, "..."),
        ]
        messages = []
        for call in calls:
            with pytest.raises(InvalidArgument) as refused:
                await call
            messages.append(str(refused.value))
        return messages

    messages = on_state(tmp_path, public_corpus, run)
    assert messages[0].startswith("k must be at least 1") and messages[1].startswith("order must be 0 (any) or 1..")
    assert "n-grams in one call" in messages[2] and messages[3] == "give at least one n-gram"
    assert "a context of" in messages[4] and messages[5] == "the text has no words"


def test_the_model_cache_keeps_the_newest_four(tmp_path, public_corpus):
    async def run(state):
        await ingest.ingest(state, ingest_batch(SENTENCES))
        made = [
            await release.release(state, ReleaseSpec(epsilon=0.5, mechanism="laplace", force=True)) for _ in range(5)
        ]
        models = [await query.model(state, r.release_id) for r in made]
        again = await query.model(state, made[-1].release_id)
        return [r.release_id for r in made], models, again, list(state.models)

    ids, models, again, cached = on_state(tmp_path, public_corpus, run)
    assert again is models[-1] and cached == ids[1:]
