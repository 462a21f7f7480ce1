"""The release language model: joint, conditional, perplexity, ARPA export."""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest

from lac.curator.lm import UNK, NgramModel
from lac.curator.ngrams import NgramVocabulary

SENTENCES = [s.split() for s in (
    "the dog sleeps in the sun", "the fox is a small animal", "we walk the dog", "the sun is a star",
    "the dog and the fox are friends", "a fox is a small animal", "the park is green")]


@pytest.fixture
def model() -> NgramModel:
    v = NgramVocabulary.from_sentences(SENTENCES, max_n=3)
    lp = np.log(v.alpha / v.alpha.sum())
    return NgramModel(v.items, lp, max_n=3)


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


def test_joint_is_renormalised_within_each_order(model):
    v = NgramVocabulary.from_sentences(SENTENCES, max_n=3)
    uni = [it for it in v.items if " " not in it]
    assert sum(model.prob(w) for w in uni) == pytest.approx(1.0)
    assert model.prob("the dog") > model.prob("the park") > 0
    assert model.prob("no such") == 0.0
    with pytest.raises(ValueError):
        model.prob("a b c d")


def test_next_word_conditional_and_backoff(model):
    top = model.next_word(["the"], 3)
    assert top[0][0] == "dog" and sum(p for _, p in model.next_word("the", 1000)) == pytest.approx(1.0)
    assert model.next_word("walk the", 1)[0][0] == "dog"
    # Unseen context "zebra the": backs off to "the".
    assert model.next_word("zebra the", 3) == top
    assert model.context_used("zebra the") == ("the",)
    assert model.next_word("<s>", 1)[0][0] == "the"
    assert model.next_word("zebra", 2) == model.next_word([], 2)


def test_perplexity_finite_and_ordered(model):
    seen = model.perplexity([["the", "dog", "sleeps", "in", "the", "sun"]])
    unseen = model.perplexity([["zebra", "quantum", "the"]])
    assert math.isfinite(seen) and math.isfinite(unseen) and 1 < seen < unseen
    assert model.perplexity(["the dog", []]) == model.perplexity([["the", "dog"]])
    with pytest.raises(ValueError):
        model.perplexity([[]])


def test_arpa_structure_and_normalisation(model, tmp_path):
    path = tmp_path / "lm.arpa"
    model.write_arpa(path)
    text = path.read_text()
    assert text == model.arpa()
    header, entries = parse_arpa(text)
    assert set(header) == {1, 2, 3} and ("<s>",) in entries and (UNK,) in entries and ("</s>",) in entries
    assert entries[("<s>",)][0] == -99
    words = [g[0] for g in entries if len(g) == 1 and g != ("<s>",)]
    for n in (2, 3):  # every n-gram's prefix and suffix are in the file
        for g in (g for g in entries if len(g) == n):
            assert g[:-1] in entries and g[1:] in entries
    for ctx in [(), ("<s>",), ("the",), ("<s>", "the"), ("the", "dog"), ("zebra",), ("is", "a"), ("dog",)]:
        total = sum(arpa_prob(entries, w, ctx) for w in words)
        assert total == pytest.approx(1.0, abs=1e-5), ctx
        for w in ("dog", "fox", "</s>", "zebra"):
            w2 = w if (w,) in entries else UNK
            assert arpa_prob(entries, w2, ctx) == pytest.approx(model.conditional(w, ctx), rel=1e-5)
    buf = io.StringIO()
    model.write_arpa(buf)
    assert buf.getvalue() == text


def test_zero_probabilities_and_missing_prefixes():
    items = ["a", "b", "</s>", "a b", "b a", "b </s>", "c a b", "a b </s>", "b b </s>"]
    with np.errstate(divide="ignore"):
        lp = np.log([0.3, 0.2, 0.1, 0.2, 0.0, 0.1, 0.1, 0.1, 0.1])
    m = NgramModel(items, lp, max_n=3)
    _, entries = parse_arpa(m.arpa())
    assert ("b", "a") not in entries and ("c", "a", "b") not in entries and ("a", "b", "</s>") in entries
    assert ("b", "b", "</s>") not in entries  # prefix "b b" is missing
    assert math.isfinite(m.perplexity([["a", "b", "c"]]))
    m1 = NgramModel(items, lp, max_n=1)
    header, _ = parse_arpa(m1.arpa())
    assert set(header) == {1}
    with pytest.raises(ValueError):
        NgramModel(items, lp[:-1])


def test_kenlm_loads_the_file_and_agrees(model, tmp_path):
    kenlm = pytest.importorskip("kenlm")  # optional: not a dependency of the curator
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
