"""The release language model: interpolated Kneser–Ney over (pseudo-)counts, joint and conditional
views, perplexity, ARPA export; oracles: nltk's KneserNeyInterpolated and KenLM reading our ARPA."""

from __future__ import annotations

import functools
import io
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lac.common.text import sentences
from lac.curator.base.ngrams import NgramVocabulary, ngrams
from lac.curator.lm.model import UNK, NgramModel, count_of_counts, default_total, estimate_discounts

SENTENCES = [
    s.split()
    for s in (
        "the dog sleeps in the sun",
        "the fox is a small animal",
        "we walk the dog",
        "the sun is a star",
        "the dog and the fox are friends",
        "a fox is a small animal",
        "the park is green",
    )
]


@pytest.fixture
def model() -> NgramModel:
    v = NgramVocabulary.from_sentences(SENTENCES, max_n=3)
    lp = np.log(v.alpha / v.alpha.sum())
    return NgramModel(v.items, lp, max_n=3)


# -- real text: the Lee news corpus shipped with gensim ------------------------------------------


@functools.lru_cache(maxsize=1)
def _lee_text() -> tuple[tuple[str, ...], ...]:
    import gensim

    path = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    return tuple(tuple(x) for x in sentences(path.read_text(encoding="utf-8")))


def lee_sentences() -> list[list[str]]:
    """The Lee news corpus (gensim's test data), tokenised with ``lac.common.text.sentences``."""
    return [list(x) for x in _lee_text()]


def with_unk(train: list[list[str]], *others: list[list[str]], min_count: int = 2):
    """Words seen fewer than ``min_count`` times in ``train`` become ``<unk>`` everywhere."""
    freq = Counter(w for s in train for w in s)
    keep = {w for w, c in freq.items() if c >= min_count}
    return [[[w if w in keep else UNK for w in s] for s in part] for part in (train, *others)]


def item_counts(sents: list[list[str]], max_n: int = 3) -> tuple[list[str], np.ndarray]:
    c = Counter(g for s in sents for g in ngrams(s, max_n))
    items = sorted(c)
    return items, np.array([c[g] for g in items], dtype=float)


@pytest.fixture(scope="module")
def lee_all() -> list[list[str]]:
    """All Lee sentences (tokenising takes about a second: done once, in set-up)."""
    return lee_sentences()


@pytest.fixture(scope="module")
def lee(lee_all):
    """90% / 10% split of the Lee corpus, rare training words as <unk>, exact item counts."""
    s = lee_all
    cut = int(0.9 * len(s))
    train, test = with_unk(s[:cut], s[cut:])
    items, counts = item_counts(train)
    return train, test, items, counts


@pytest.fixture(scope="module")
def lee_model(lee):
    _, _, items, counts = lee
    return NgramModel.from_counts(items, counts, 3)


def log10_total(model: NgramModel, sents) -> tuple[float, int]:
    total, n = 0.0, 0
    for s in sents:
        hist = ["<s>"]
        for w in list(s) + ["</s>"]:
            total += math.log10(model.conditional(w, hist))
            hist.append(w)
            n += 1
    return total, n


# -- an independent ARPA reader (standard back-off semantics) ------------------------------------


def parse_arpa(text: str) -> tuple[dict[int, int], dict[tuple[str, ...], tuple[float, float]]]:
    lines = text.split("\n")
    assert lines[0] == "" and lines[1] == "\\data\\"
    header, entries, section = {}, {}, None
    for line in lines[2:]:
        if not line:
            continue
        if m := re.fullmatch(r"ngram (\d+)=(\d+)", line):
            assert section is None
            header[int(m[1])] = int(m[2])
        elif m := re.fullmatch(r"\\(\d+)-grams:", line):
            section = int(m[1])
            assert section == (max(k for k, *_ in [(0,)] + [(len(g),) for g in entries]) + 1)
        elif line == "\\end\\":
            section = "end"
        else:
            assert section not in (None, "end")
            parts = line.split("\t")
            assert len(parts) in (2, 3)
            g = tuple(parts[1].split(" "))
            assert len(g) == section and g not in entries
            entries[g] = (float(parts[0]), float(parts[2]) if len(parts) == 3 else 0.0)
    assert section == "end"
    for n, count in header.items():
        assert count == sum(len(g) == n for g in entries)
    return header, entries


def arpa_prob(entries, word: str, context: tuple[str, ...]) -> float:
    """Standard ARPA back-off evaluation, independent of NgramModel."""
    if context + (word,) in entries:
        return 10 ** entries[context + (word,)][0]
    bow = entries.get(context, (0.0, 0.0))[1] if context else 0.0
    return 10**bow * arpa_prob(entries, word, context[1:])


def check_arpa_closed(entries) -> None:
    for g in entries:
        if len(g) >= 2:
            assert g[:-1] in entries and g[1:] in entries, g
        assert entries[g][0] <= 0


# -- an independent reference implementation of the documented estimator -------------------------


def reference_kn(items: list[str], counts: np.ndarray, modified: bool = True):
    """Interpolated (modified) KN over fractional counts straight from the formulas in the
    module docstring, with dictionaries; items must use only words of the unigram items."""
    raw = {}
    for it, c in zip(items, counts):
        g = tuple(it.split())
        raw[g] = raw.get(g, 0.0) + float(c)
    N = max(len(g) for g, c in raw.items() if c > 0)
    vocab = {g[0] for g in raw if len(g) == 1} | {"</s>", UNK}

    def adjusted(n: int) -> dict[tuple[str, ...], float]:
        a: dict[tuple[str, ...], float] = {}
        for g, c in raw.items():
            if len(g) == n and (n == N or g[0] == "<s>") and c > 0:
                a[g] = a.get(g, 0.0) + c
            if len(g) == n + 1 and n < N and c > 0:
                a[g[1:]] = a.get(g[1:], 0.0) + min(1.0, c)
        return a

    adj = {n: adjusted(n) for n in range(1, N + 1)}

    def discounts(a: dict) -> tuple[float, float, float]:
        nk = [sum(max(0.0, 1 - abs(v - k)) for v in a.values() if v > 0) for k in (1, 2, 3, 4)]
        if nk[0] == 0 or nk[1] == 0:
            return (0.5, 1.0, 1.5) if modified else (0.5,) * 3
        y = nk[0] / (nk[0] + 2 * nk[1])
        if not modified:
            return (y,) * 3
        d = tuple(k - (k + 1) * y * nk[k] / nk[k - 1] for k in (1, 2, 3))
        ok = nk[2] > 0 and 0 < d[0] <= 1 and 0 <= d[1] <= 2 and 0 <= d[2] <= 3
        return d if ok else (0.5, 1.0, 1.5)

    disc = {n: discounts(adj[n]) for n in adj}

    def D(c: float, d) -> float:
        if c < 1:
            return min(c, d[0])
        if c < 2:
            return d[0] + (d[1] - d[0]) * (c - 1)
        if c < 3:
            return d[1] + (d[2] - d[1]) * (c - 2)
        return d[2]

    tot = {n: {} for n in adj}
    dsum = {n: {} for n in adj}
    for n, a in adj.items():
        for g, v in a.items():
            tot[n][g[:-1]] = tot[n].get(g[:-1], 0.0) + v
            dsum[n][g[:-1]] = dsum[n].get(g[:-1], 0.0) + D(v, disc[n])

    def prob(w: str, h: tuple[str, ...]) -> float:
        w = w if w in vocab else UNK
        h = tuple(t if t in vocab or t == "<s>" else UNK for t in h)[len(h) - (N - 1) :] if N > 1 else ()
        n = len(h) + 1
        if n == 1:
            t = tot[1][()]
            return (adj[1].get((w,), 0.0) - D(adj[1].get((w,), 0.0), disc[1])) / t + dsum[1][()] / t / len(vocab)
        t = tot[n].get(h, 0.0)
        if t == 0:
            return prob(w, h[1:])
        a = adj[n].get(h + (w,), 0.0)
        return (a - D(a, disc[n])) / t + dsum[n][h] / t * prob(w, h[1:])

    return prob, disc


# -- the unsmoothed views -----------------------------------------------------------------------


def test_joint_is_renormalised_within_each_order(model):
    v = NgramVocabulary.from_sentences(SENTENCES, max_n=3)
    uni = [it for it in v.items if " " not in it]
    assert sum(model.prob(w) for w in uni) == pytest.approx(1.0)
    assert model.prob("the dog") > model.prob("the park") > 0
    assert model.prob("no such") == 0.0
    with pytest.raises(ValueError):
        model.prob("a b c d")
    m = NgramModel.from_counts(["a", "b", "a b", "a"], [1.0, 3.0, 2.0, 1.0], max_n=2)
    merged = NgramModel.from_counts(["a", "b", "a b"], [2.0, 3.0, 2.0], max_n=2)
    assert m.prob("a") == merged.prob("a") and m.prob("a b") == 1.0  # duplicated items add up
    # Smoothed: the raw unigram counts 2 and 3, discounted by KenLM's fallback (1, 1.5), the
    # discount mass 2.5 spread over the 4 words (a, b, </s>, <unk>), renormalised over a and b.
    assert m.prob("a") == pytest.approx((1 / 5 + 2.5 / 5 / 4) / (2.5 / 5 + 2 * 2.5 / 5 / 4))


def test_next_word_conditional_and_backoff(model):
    top = model.next_word(["the"], 3)
    assert top[0][0] == "dog" and sum(p for _, p in model.next_word("the", 1000)) == pytest.approx(1.0)
    assert top == [("dog", pytest.approx(3 / 8)), ("fox", pytest.approx(2 / 8)), ("sun", pytest.approx(2 / 8))]
    assert model.next_word("walk the", 1)[0][0] == "dog"
    # Unseen context "zebra the": backs off to "the".
    assert model.next_word("zebra the", 3) == top
    assert model.context_used("zebra the") == ("the",)
    assert model.next_word("<s>", 1)[0][0] == "the"
    assert model.next_word("zebra", 2) == model.next_word([], 2)
    with pytest.raises(ValueError):
        model.next_word("the", 0)


# -- the estimator --------------------------------------------------------------------------------


def test_discounts_from_count_of_counts():
    c = np.array([1] * 50 + [2] * 20 + [3] * 10 + [4] * 6 + [9] * 3, dtype=float)
    assert count_of_counts(c).tolist() == [50, 20, 10, 6]
    y = 50 / (50 + 40)
    assert estimate_discounts(c, modified=False) == pytest.approx((y,) * 3)
    assert estimate_discounts(c) == pytest.approx((1 - 2 * y * 20 / 50, 2 - 3 * y * 10 / 20, 3 - 4 * y * 6 / 10))
    # A fractional count is split between its neighbouring integers.
    assert count_of_counts(np.array([1.25, 0.5, 3.0])).tolist() == pytest.approx([0.75 + 0.5, 0.25, 1.0, 0.0])
    assert estimate_discounts(np.array([1.0, 1.0, 5.0])) == (0.5, 1.0, 1.5)  # no twos: KenLM's fallback
    assert estimate_discounts(np.array([1.0, 1.0, 5.0]), modified=False) == (0.5,) * 3


def test_nltk_kneser_ney_oracle(lee_all):
    """Same estimator as nltk.lm.KneserNeyInterpolated on real text: same items, one discount D at
    orders 2-3 and none at order 1 (nltk does not smooth unigrams). nltk treats a context shorter
    than order − 1 as a lower order (continuation counts); ``<s> w`` has no left extension, so the
    first word of a sentence is scored with nltk's bigram model, where ``<s> w`` is the top order
    with raw counts - as in our model and KenLM. Everything else is nltk's trigram model."""
    from nltk.lm import KneserNeyInterpolated

    s = lee_all
    train, test = with_unk(s[:100], s[2400:2408])
    grams = [[tuple(g.split()) for g in ngrams(x, 3)] for x in train]
    words = sorted({w for x in train for w in x}) + ["<s>", "</s>"]
    items, counts = item_counts(train)
    for d in (0.1, 0.75):
        lm3 = KneserNeyInterpolated(3, discount=d)
        lm3.fit(grams, words)
        lm2 = KneserNeyInterpolated(2, discount=d)
        lm2.fit([[g for g in x if len(g) <= 2] for x in grams], words)
        ours = NgramModel.from_counts(items, counts, 3, discount=[0.0, d, d])
        n = 0
        for x in test:
            hist = ["<s>"]
            for w in x + ["</s>"]:
                theirs = lm2.score(w, hist) if len(hist) == 1 else lm3.score(w, hist[-2:])
                assert ours.conditional(w, hist) == pytest.approx(theirs, rel=1e-9), (w, hist)
                hist.append(w)
                n += 1
        assert n > 150


def test_reference_implementation_on_fractional_counts(lee_all):
    """Noisy fractional counts (as in a release): the vectorised model equals a dictionary
    implementation of the documented formulas, modified and plain."""
    s = lee_all[:120]
    items, counts = item_counts(s)
    rng = np.random.default_rng(7)
    noisy = np.maximum(counts * rng.uniform(0.3, 1.7, counts.size) + rng.normal(0, 0.3, counts.size), 0.0)
    noisy[rng.random(counts.size) < 0.1] = 0.0  # some items released as 0 (missing prefixes/suffixes)
    for modified in (True, False):
        m = NgramModel.from_counts(items, noisy, 3, modified=modified)
        ref, disc = reference_kn(items, noisy, modified)
        assert np.ravel(m.discounts) == pytest.approx(np.ravel([disc[n] for n in (1, 2, 3)]))
        for x in s[:12] + [["the", "zebra", "said"], ["police", "said", "the", "the"]]:
            hist = ["<s>"]
            for w in x + ["</s>"]:
                assert m.conditional(w, hist) == pytest.approx(ref(w, tuple(hist)), rel=1e-9), (w, hist)
                hist.append(w)


def test_integer_counts_are_plain_kneser_ney():
    """Tiny hand-checked interpolated KN (one discount D = 0.5 everywhere)."""
    items = ["a", "b", "</s>", "<s> a", "a b", "b </s>", "<s> b", "b b", "<s> a b", "a b </s>", "<s> b b", "b b </s>"]
    counts = [1, 3, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1]
    m = NgramModel.from_counts(items, counts, 3, discount=0.5)
    # Unigram continuation counts: a <- {<s>}: 1, b <- {<s>, a, b}: 3, </s> <- {b}: 1; γ₀ = 0.5·3/5, |V| = 4.
    p1 = {"a": 0.5 / 5 + 0.3 / 4, "b": 2.5 / 5 + 0.3 / 4, "</s>": 0.5 / 5 + 0.3 / 4, UNK: 0.3 / 4}
    for w, p in p1.items():
        assert m.conditional(w) == pytest.approx(p)
    # Context "b", continuation counts: b </s> <- {a, b}: 2, b b <- {<s>}: 1; γ(b) = 0.5·2/3.
    pb = {w: (max(c - 0.5, 0) / 3) + 0.5 * 2 / 3 * p1[w] for w, c in {"</s>": 2, "b": 1, "a": 0, UNK: 0}.items()}
    for w, p in pb.items():
        assert m.conditional(w, "b") == pytest.approx(p)
    # Trigram "<s> b": raw counts, one continuation b (count 1).
    for w in ("a", "b", "</s>"):
        assert m.conditional(w, "<s> b") == pytest.approx((0.5 if w == "b" else 0) + 0.5 * pb[w])
    # "<s>" at order 2 uses raw counts: <s> a (1), <s> b (1).
    assert m.conditional("a", "<s>") == pytest.approx(0.5 / 2 + 0.5 * 2 / 2 * p1["a"])


def test_every_context_sums_to_one(model, lee_all):
    s = lee_all[:80]
    items, counts = item_counts(s)
    rng = np.random.default_rng(3)
    noisy = np.maximum(counts + rng.normal(0, 0.7, counts.size), 0.0)
    for m in (
        model,
        NgramModel.from_counts(items, noisy, 3),
        NgramModel.from_counts(items, counts, 3),
        NgramModel.from_counts(items, counts, 2, modified=False),
        NgramModel.from_counts(items, counts, 1),
    ):
        vocab = sorted(m.vocabulary)
        contexts = [
            (),
            ("<s>",),
            ("the",),
            ("<s>", "the"),
            ("of", "the"),
            ("zebra",),
            ("zebra", "the"),
            ("the", "zebra"),
            ("</s>",),
            ("a", "<s>"),
        ]
        for ctx in contexts:
            assert sum(m.conditional(w, ctx) for w in vocab) == pytest.approx(1.0, abs=1e-9), ctx
        assert all(m.conditional(w, ctx) > 0 for w in vocab for ctx in contexts[:4])


def test_fractional_generalisation_is_continuous_and_discounts_small_counts_fully(lee_all):
    s = lee_all[:60]
    items, counts = item_counts(s)
    m = NgramModel.from_counts(items, counts, 3)
    eps = NgramModel.from_counts(items, counts * (1 + 1e-9), 3, discount=m.discounts)
    for ctx, w in [(("<s>",), "the"), (("of", "the"), "said"), ((), "police"), (("the",), "police")]:
        assert eps.conditional(w, ctx) == pytest.approx(m.conditional(w, ctx), rel=1e-6)
    big = item_counts(lee_all[:400])[1]
    assert np.ravel(estimate_discounts(big * (1 + 1e-9))) == pytest.approx(np.ravel(estimate_discounts(big)))
    # A trigram whose pseudo-count is below its discount carries no mass of its own: P(w | h) is
    # the back-off value γ(h) P(w | h⁻), with γ(h) read off a word that never follows h.
    assert "the people" not in items and "people" in items and "of the wind" in items
    m2 = NgramModel.from_counts(
        items + ["of the people"], np.append(counts, 0.5 * m.discounts[2][0]), 3, discount=m.discounts
    )
    gamma = m2.conditional("</s>", "of the") / m2.conditional("</s>", "the")
    assert m2.conditional("people", "of the") == pytest.approx(gamma * m2.conditional("people", "the"), rel=1e-12)
    assert m2.conditional("wind", "of the") > gamma * m2.conditional("wind", "the")


def test_unk_mass_and_unk_items():
    items = ["a", "b", "</s>", "<s> a", "a b", "b </s>"]
    counts = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    m = NgramModel.from_counts(items, counts, 2, unk_mass=0.05)
    assert m.conditional("zebra") == pytest.approx(0.05) and m.conditional(UNK) == m.conditional("zebra")
    assert m.vocabulary == {"a", "b", "</s>", UNK}
    assert sum(m.conditional(w) for w in m.vocabulary) == pytest.approx(1.0)
    plain = NgramModel.from_counts(items, counts, 2, discount=[0.5, 0.5])
    # Without unk_mass, <unk> gets its uniform share only: γ₀ / |V| (continuation counts 1, 1, 1).
    assert plain.conditional("zebra") == pytest.approx(0.5 * 3 / 3 / 4)
    # A <unk> item is a word like any other; other unknown words are read as <unk>.
    u = NgramModel.from_counts(items + [UNK, "a <unk>", "<unk> </s>"], counts + [5.0, 5.0, 5.0], 2)
    assert u.conditional("zebra", "a") == u.conditional(UNK, "a") > u.conditional("b", "a")
    with pytest.raises(ValueError, match="unk_mass"):
        NgramModel.from_counts(items + [UNK], counts + [1.0], 2, unk_mass=0.1)
    # Words inside higher-order items that are not unigram items are read as <unk> too.
    v = NgramModel.from_counts(items + ["a c"], counts + [3.0], 2)
    assert v.conditional("c", "a") == v.conditional(UNK, "a") > v.conditional("zebra", "b")


def test_legacy_constructor_is_from_counts_on_scaled_probabilities(lee):
    train, test, items, counts = lee
    exact = NgramModel.from_counts(items, counts, 3)
    lp = np.log(counts / counts.sum())
    scaled = NgramModel(items, lp, 3, total=counts.sum())
    default = NgramModel(items, lp + 5.0, 3)  # unnormalised log-probabilities are renormalised
    assert default_total(counts / counts.sum()) == pytest.approx(counts.sum())  # the quantile item occurs once
    for m in (scaled, default):
        for x in test[:5]:
            assert m.perplexity([x]) == pytest.approx(exact.perplexity([x]), rel=1e-9)
    half = NgramModel(items, lp, 3, total=counts.sum() / 2)
    assert half.perplexity(test) != pytest.approx(exact.perplexity(test), rel=1e-3)
    with pytest.raises(ValueError):
        NgramModel(items, lp, 3, total=0)
    assert default_total(np.zeros(3)) == 1.0


def test_perplexity_finite_and_ordered(model, lee_model):
    seen = model.perplexity([["the", "dog", "sleeps", "in", "the", "sun"]])
    unseen = model.perplexity([["zebra", "quantum", "the"]])
    assert math.isfinite(seen) and math.isfinite(unseen) and 1 < seen < unseen
    assert model.perplexity(["the dog", []]) == model.perplexity([["the", "dog"]])
    with pytest.raises(ValueError):
        model.perplexity([[]])
    odd = [["<s>", "</s>", "<unk>", "the"], ["xyzzy"] * 5, ["<s>"], ["the", "the", "the", "the"]]
    for m in (model, lee_model, NgramModel.from_counts(["a"], [0.0], 3), NgramModel.from_counts([], [], 3)):
        assert math.isfinite(m.perplexity(odd))


def _perplexity_word_by_word(m: NgramModel, sents) -> float:
    """The definition: one conditional per word and per sentence end, summed in order."""
    total, count = 0.0, 0
    for s in sents:
        words = s.split() if isinstance(s, str) else list(s)
        hist = ["<s>"]
        for w in words + ["</s>"] if words else []:
            p = m.conditional(w, hist[-m.order :])
            total += math.log(p) if p > 0 else -math.inf
            hist.append(w)
            count += 1
    return math.exp(-total / count)


def test_perplexity_looks_every_word_up_at_once_and_equals_the_word_by_word_definition(model, lee, lee_model):
    """Bit for bit, on held-out text (unknown words, sentence starts, every back-off depth), for models of each
    order, a partial one and one whose keys do not fit int64 (then the lookups run one word at a time)."""
    _, test, items, counts = lee
    odd = [["<s>", "</s>", "<unk>", "the"], ["xyzzy"] * 5, ["<s>"], ["the"] * 4, "the dog", []]
    models = [model, lee_model, NgramModel.from_counts(items, counts, 3, partial=True)]
    for n in (1, 2):
        low = [i for i, it in enumerate(items) if it.count(" ") < n]
        models.append(NgramModel.from_counts([items[i] for i in low], np.asarray(counts)[low], n))
    for m in models:
        assert m.perplexity(test + odd) == _perplexity_word_by_word(m, test + odd)
    wide = NgramModel.from_counts(items, counts, 3)
    wide._keys = {n: k.astype(object) for n, k in wide._keys.items()}
    assert wide.perplexity(test + odd) == _perplexity_word_by_word(lee_model, test + odd)


def test_zero_counts_and_missing_prefixes():
    items = ["a", "b", "</s>", "a b", "b a", "b </s>", "c a b", "a b </s>", "b b </s>"]
    with np.errstate(divide="ignore"):
        lp = np.log([0.3, 0.2, 0.1, 0.2, 0.0, 0.1, 0.1, 0.1, 0.1])
    m = NgramModel(items, lp, max_n=3)
    _, entries = parse_arpa(m.arpa())
    check_arpa_closed(entries)
    assert ("b", "a") not in entries  # a zero count is not stored
    # "c" is not a unigram item: "c a b" is read as "<unk> a b"; missing prefixes/suffixes are added.
    assert ("<unk>", "a", "b") in entries and ("<unk>", "a") in entries and ("a", "b", "</s>") in entries
    assert ("b", "b", "</s>") in entries and ("b", "b") in entries
    assert math.isfinite(m.perplexity([["a", "b", "c"]]))
    m1 = NgramModel(items, lp, max_n=1)
    header, _ = parse_arpa(m1.arpa())
    assert set(header) == {1}
    m2 = NgramModel(["a", "b", "a b", "a b c"], [math.log(0.4), math.log(0.4), math.log(0.2), -math.inf], max_n=3)
    assert m2.order == 2 and set(parse_arpa(m2.arpa())[0]) == {1, 2}
    for bad in (
        lambda: NgramModel(items, lp[:-1]),
        lambda: NgramModel.from_counts(items, -np.ones(9)),
        lambda: NgramModel.from_counts(items, np.full(9, np.nan)),
        lambda: NgramModel.from_counts(items, lp),
        lambda: NgramModel.from_counts(items, np.ones(9), 0),
        lambda: NgramModel.from_counts(items, np.ones(9), 3, discount=[0.5, 2.5, 0.5]),
        lambda: NgramModel.from_counts(items, np.ones(9), 3, discount=[0.5, 0.5]),
        lambda: NgramModel.from_counts(["a", ""], np.ones(2)),
    ):
        with pytest.raises(ValueError):
            bad()


# -- ARPA -------------------------------------------------------------------------------------------


def test_arpa_structure_and_normalisation(model, tmp_path):
    path = tmp_path / "lm.arpa"
    model.write_arpa(path)
    text = path.read_text()
    assert text == model.arpa()
    header, entries = parse_arpa(text)
    check_arpa_closed(entries)
    assert set(header) == {1, 2, 3} and ("<s>",) in entries and (UNK,) in entries and ("</s>",) in entries
    assert entries[("<s>",)][0] == -99
    words = [g[0] for g in entries if len(g) == 1 and g != ("<s>",)]
    for ctx in [(), ("<s>",), ("the",), ("<s>", "the"), ("the", "dog"), ("zebra",), ("is", "a"), ("dog",)]:
        total = sum(arpa_prob(entries, w, ctx) for w in words)
        assert total == pytest.approx(1.0, abs=1e-5), ctx
        for w in ("dog", "fox", "</s>", "zebra"):
            w2 = w if (w,) in entries else UNK
            assert arpa_prob(entries, w2, ctx) == pytest.approx(model.conditional(w, ctx), rel=1e-5)
    buf = io.StringIO()
    model.write_arpa(buf)
    assert buf.getvalue() == text


def test_arpa_reproduces_conditional_on_noisy_real_counts(lee):
    train, test, items, counts = lee
    rng = np.random.default_rng(11)
    noisy = np.maximum(counts + rng.normal(0, 0.8, counts.size), 0.0)
    m = NgramModel.from_counts(items, noisy, 3)
    _, entries = parse_arpa(m.arpa())
    check_arpa_closed(entries)
    for x in test[:15]:
        hist = ["<s>"]
        for w in x + ["</s>"]:
            ctx = tuple(hist[-2:])
            w2 = w if (w,) in entries else UNK
            ctx2 = tuple(t if (t,) in entries else UNK for t in ctx)
            assert arpa_prob(entries, w2, ctx2) == pytest.approx(m.conditional(w, ctx), rel=1e-5)
            hist.append(w)


@pytest.mark.parametrize("noise", [0.0, 0.8])
def test_kenlm_loads_real_model_and_agrees(lee, tmp_path, noise):
    kenlm = pytest.importorskip("kenlm")  # optional: a test dependency, not one of the curator
    train, test, items, counts = lee
    rng = np.random.default_rng(5)
    c = np.maximum(counts + rng.normal(0, noise, counts.size), 0.0) if noise else counts
    m = NgramModel.from_counts(items, c, 3)
    path = tmp_path / "lee.arpa"
    m.write_arpa(path)
    lm = kenlm.Model(str(path))
    assert lm.order == 3
    ours, n = log10_total(m, test)
    theirs = sum(lm.score(" ".join(x), bos=True, eos=True) for x in test)
    assert theirs == pytest.approx(ours, rel=1e-4)
    assert 10 ** (-theirs / n) == pytest.approx(m.perplexity(test), rel=1e-4)


def test_kenlm_loads_the_file_and_agrees(model, tmp_path):
    kenlm = pytest.importorskip("kenlm")
    path = tmp_path / "lm.arpa"
    model.write_arpa(path)
    lm = kenlm.Model(str(path))
    assert lm.order == 3
    for sentence in ("the dog sleeps in the sun", "zebra the dog", "a fox is a star"):
        words, hist, ours = sentence.split(), ["<s>"], 0.0
        for w in words + ["</s>"]:
            ours += math.log10(model.conditional(w, hist))
            hist.append(w)
        assert lm.score(sentence, bos=True, eos=True) == pytest.approx(ours, abs=1e-4)
        assert lm.perplexity(sentence) == pytest.approx(model.perplexity([words]), rel=1e-4)


# -- held-out perplexity against an established implementation --------------------------------------


def test_heldout_perplexity_is_that_of_kneser_ney(lee, lee_model):
    """Exact counts (a non-private baseline): far better than the old constant-λ model's ~2,800, and
    modified KN at least as good as plain KN."""
    train, test, items, counts = lee
    ppl = lee_model.perplexity(test)
    plain = NgramModel.from_counts(items, counts, 3, modified=False).perplexity(test)
    assert 100 < ppl < 160 and ppl <= plain * 1.01


@pytest.mark.slow
def test_heldout_perplexity_within_10_percent_of_nltk(lee, lee_model):
    """nltk's KneserNeyInterpolated with its standard padding pipeline (D = 0.75, near the
    estimated discounts; its default 0.1 is much worse) on the same tokens and vocabulary. nltk
    is slow (continuation counts by scanning), so 60 held-out sentences."""
    from nltk.lm import KneserNeyInterpolated
    from nltk.lm.preprocessing import padded_everygram_pipeline

    train, test, _, _ = lee
    test = test[:60]
    lm = KneserNeyInterpolated(3, discount=0.75)
    grams, vocab = padded_everygram_pipeline(3, train)
    lm.fit(grams, vocab)
    total, n = 0.0, 0
    for x in test:
        padded = ["<s>", "<s>"] + x + ["</s>"]
        for i in range(2, len(padded)):
            total += math.log(lm.score(padded[i], padded[i - 2 : i]))
            n += 1
    theirs = math.exp(-total / n)
    ours = lee_model.perplexity(test)
    assert ours <= 1.1 * theirs, (ours, theirs)


def test_default_total_ignores_tails_below_resolution():
    p = np.full(1000, 1e-300)
    p[:3] = 1.0
    assert default_total(p / p.sum()) == pytest.approx(3.0)  # not 1e300: the tails are numerically zero


def test_partial_release_sums_to_one_and_backs_off_unlisted_mass(lee):
    """``partial=True``: the items are part of the n-grams (a release over a vocabulary). Every context's
    distribution still sums to 1, a context seen more often than its listed continuations gives the
    rest to the lower order, and on held-out text this beats reading the listed n-grams as all there is."""
    train, test, items, counts = lee
    orders = np.array([it.count(" ") + 1 for it in items])
    # a release over a vocabulary: every unigram, and the bigrams and trigrams seen at least twice
    keep = (orders == 1) | (counts >= 2)
    sub_items = [it for it, k in zip(items, keep) if k]
    sub = counts[keep]
    partial = NgramModel.from_counts(sub_items, sub, 3, partial=True)
    closed = NgramModel.from_counts(sub_items, sub, 3)
    vocab = sorted(partial.vocabulary)
    for ctx in [(), ("<s>",), ("the",), ("<s>", "the"), ("of", "the"), ("in", "the"), ("said", "the")]:
        assert sum(partial.conditional(w, ctx) for w in vocab) == pytest.approx(1.0, abs=1e-9), ctx
    # "the" occurs far more often than its released continuations add up to: the rest backs off
    listed = sum(c for it, c in zip(sub_items, sub) if it.startswith("the ") and it.count(" ") == 1)
    the = float(counts[items.index("the")])
    assert listed < 0.9 * the
    unlisted = next(w for w in vocab if f"the {w}" not in set(sub_items) and f"the {w}" in set(items))
    gamma = partial.conditional(unlisted, ("the",)) / partial.conditional(unlisted, ())
    assert gamma >= (the - listed) / the  # an unlisted word after "the" gets γ(the)·P(w), γ ≥ the unlisted share
    assert partial.perplexity(test) < closed.perplexity(test)
    # with every n-gram listed the lower orders are raw counts instead of continuation counts: close to KN
    full = NgramModel.from_counts(items, counts, 3)
    assert NgramModel.from_counts(items, counts, 3, partial=True).perplexity(test) == pytest.approx(
        full.perplexity(test), rel=0.25
    )
