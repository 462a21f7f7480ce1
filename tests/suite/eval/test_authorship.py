"""Authorship vs topic after the Localizer (lac.suite.eval.authorship): the attackers, the audit, the data from
packages, the library function and the `lac eval` section."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lac.common.cli import main
from lac.common.text import words
from lac.suite.data import gcide_author
from lac.suite.eval import authorship
from lac.suite.eval.config import PRESETS

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def splits():
    return authorship.authorship_data(TINY.with_overrides(authorship_unknown=8), np.random.default_rng(7))


def test_gcide_author_normalises_attributions():
    assert gcide_author("Shak.") == "Shak."
    assert gcide_author("Shak") == "Shak."
    assert gcide_author("Milton .") == "Milton."
    assert gcide_author("Sir W. Scott.") == "Sir W. Scott."
    assert gcide_author("Beau. & Fl.") == "Beau. & Fl."
    assert gcide_author("Shak. (Hamlet)") is None
    assert gcide_author("Bible (1551).") is None
    assert gcide_author("") is None


def test_labelled_sets_from_packages():
    quotes, defs = authorship.labelled_sets()
    assert len(quotes) > 30_000 and len(defs) > 100_000
    authors = {a for _, a in quotes}
    assert {"Shak.", "Milton.", "Dryden.", "Chaucer."} <= authors
    lex = {t for _, t in defs}
    assert set(authorship.DEFAULT_TOPICS) <= lex
    assert all(re.fullmatch(r"(noun|verb|adj|adv)\.\w+", t) for t in lex)
    dog = [t for t, lab in defs if t.startswith("a member of the genus Canis")]
    assert dog and all(lab == "noun.animal" for t, lab in defs if t in dog)


def test_snippets_have_the_length_and_never_quote_each_other(splits):
    sp, info = splits
    a = sp["author"]
    n = TINY.authorship_snippet_words
    assert all(len(t.split()) == n for t in a.train_texts + a.test_texts)
    assert len(set(a.test_labels)) == TINY.authorship_authors == len(info["authors"])
    grams = {}
    for i, t in enumerate(a.train_texts + a.test_texts):
        toks = words(t)
        for g in {tuple(toks[k : k + 6]) for k in range(len(toks) - 5)}:
            grams.setdefault(g, set()).add(i)
    # a 6-gram in two snippets comes from two quotations that were not linked (both cut mid-way): rare, never many
    shared = sum(len(v) > 1 for v in grams.values())
    assert shared <= 0.01 * len(grams)


def test_attackers_beat_chance_on_clean_text_and_not_on_shuffled_labels(splits):
    sp, _ = splits
    a = sp["author"]
    chance = a.chance()
    assert chance == pytest.approx(1 / TINY.authorship_authors)
    rng = np.random.default_rng(3)
    for make in (lambda r: authorship.KoppelAttacker(r, iterations=30), authorship.linear_author_attacker):
        model = make(rng).fit(a.train_texts, a.train_labels)
        s = authorship.Score.of(model.predict(a.test_texts), a.test_labels, chance)
        assert s.ci_low > chance, s  # significantly above chance on clean text
        perm = list(rng.permutation(np.array(a.train_labels, dtype=object)))
        shuffled = make(rng).fit(a.train_texts, perm)
        s0 = authorship.Score.of(shuffled.predict(a.test_texts), a.test_labels, chance)
        assert s0.ci_low <= chance, s0  # the audit: without labels, nothing above chance
        assert s0.accuracy < s.accuracy


def test_score_interval_and_chance():
    s = authorship.Score.of(["a", "b", "a", "a"], ["a", "b", "b", "b"], 0.25)
    assert (s.correct, s.n, s.accuracy) == (2, 4, 0.5)
    assert 0 < s.ci_low < 0.5 < s.ci_high < 1
    split = authorship.LabelledSplit(["x"], ["a"], ["y", "z", "w"], ["a", "b", "b"])
    assert split.chance() == pytest.approx(2 / 3)


def test_evaluate_on_own_texts_with_both_labels():
    quotes, _ = authorship.labelled_sets()
    keep = {"Shak.": "drama", "Milton.": "poetry", "Macaulay.": "history", "Bacon.": "essays"}
    texts, authors, topics = [], [], []
    rng = np.random.default_rng(5)
    for a in keep:
        for sn in authorship.snippets([t for t, who in quotes if who == a], 30, 40, rng):
            texts.append(sn)
            authors.append(a)
            topics.append(keep[a])
    factory = authorship.default_localizer_factory(5_000, np.random.default_rng(1))
    res = authorship.evaluate(
        texts,
        authors=authors,
        topics=topics,
        localizer_factory=factory,
        epsilons=(8.0,),
        presets=False,
        koppel_iterations=20,
        rng=rng,
    )
    for task in ("author", "topic"):
        tk = res["tasks"][task]
        assert tk["chance"] == pytest.approx(0.25)
        assert tk["test"] == 4 * 9 and tk["train"] == 4 * 21
        assert {r["epsilon"] for r in tk["rows"]} == {None, 8.0}
        for r in tk["rows"]:
            assert 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1
    assert [(r["classifier"], r["train_on"]) for r in res["tasks"]["author"]["rows"] if r["epsilon"] == 8.0] == [
        ("koppel", "clean"),
        ("koppel", "privatized"),
        ("linear", "clean"),
        ("linear", "privatized"),
    ]
    (f,) = res["frontier"]
    assert f["epsilon"] == 8.0 and f["author_limit"] == pytest.approx(0.5)
    assert 0 < res["settings"][1]["words_kept"]["author"] < 1
    json.dumps(res)  # JSON-able
    with pytest.raises(ValueError, match="authors=, topics="):
        authorship.evaluate(texts)


@pytest.mark.slow
def test_tiny_section_runs_and_writes_its_figure(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--preset", "tiny", "--only", "authorship", "--out", str(tmp_path)])
    assert e.value.code == 0
    blob = (tmp_path / "authorship.png").read_bytes()
    assert blob.startswith(b"\x89PNG") and len(blob) > 20_000
    res = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["authorship"]
    assert res["tasks"]["author"]["chance"] == pytest.approx(1 / TINY.authorship_authors)
    assert res["tasks"]["topic"]["chance"] == pytest.approx(1 / len(TINY.authorship_topics))
    eps = [s["epsilon"] for s in res["settings"]]
    assert eps == [None, 3.0, 5.0, 8.0, 10.0, 25.0]
    assert {s["preset"] for s in res["settings"]} == {None, "private", "balanced", "utility"}
    assert [f["epsilon"] for f in res["frontier"]] == eps[1:]
    clean = {r["classifier"]: r for r in res["tasks"]["author"]["rows"] if r["epsilon"] is None}
    assert all(r["ci_low"] > res["tasks"]["author"]["chance"] for r in clean.values())
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## 8. Authorship and topic after the Localizer" in report
    assert "](authorship.png)" in report
    assert "balanced (ε = 8)" in report
    assert "dict-gcide" in report and "wordnet-base" in report
