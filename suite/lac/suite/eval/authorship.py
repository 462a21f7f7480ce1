"""What an attacker can still learn from privatized text: authorship attribution vs topic classification.

Seed 003 (§6, Table 1) measures the word-level mechanism the Localizer implements as a *document*
mechanism: it should hide who wrote a text (stylistic clues) while keeping what it is about. This module
runs that measurement on real text with the real Localizer:

- **authorship attackers**, trained on the candidate authors' *clean* known texts (the paper's threat
  model: the attacker holds clean samples of every candidate and sees one privatized text), and also
  trained on the known texts privatized by the same public mechanism (an attacker that knows the
  mechanism, which is public):

  * ``koppel``: Koppel, Schler & Argamon (2011), the PAN obfuscation baseline the paper uses — character
    3-4-gram term-frequency vectors of each candidate's known text, ``iterations`` rounds each keeping a
    random ``feature_fraction`` of the features, cosine similarity of the unknown text to each candidate in
    that subspace; the candidate most often closest wins;
  * ``linear``: a stronger modern baseline, a linear SVM on character 2-5-gram TF-IDF of the known snippets;

- **a topic classifier** (``linear``: linear SVM on word 1-2-gram TF-IDF, fastText's model class), trained
  on clean labelled text and also on privatized text;

each tested on clean text and on text privatized at each preset and at a sweep of ε per word, with the
accuracy's chance level (the largest class share of the test set: what always guessing one class scores)
and a two-sided 95% Clopper–Pearson interval. A shuffled-label audit (the same classifier trained on
randomly permuted labels, tested on clean text) must score at chance: a classifier that beats chance
without labels is reading the test set.

Clean text is the tokeniser's words joined by spaces (lower case, no punctuation): exactly what the device
would perturb, so the comparison isolates the Localizer, as the paper's normalised texts did.

App developers run it on their own labelled texts with ``evaluate``; ``lac eval --only authorship`` runs
``run`` on texts from packages (``authorship_data``).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lac.client.embedding import glove_default
from lac.client.localizer import Localizer
from lac.client.mechanisms import MultivariateLaplace
from lac.client.presets import PRESETS
from lac.common.rng import RandomSource
from lac.common.text import words

from .metrics import clopper_pearson

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_TOPICS",
    "KoppelAttacker",
    "LabelledSplit",
    "Score",
    "authorship_data",
    "default_localizer_factory",
    "evaluate",
    "evaluate_splits",
    "frontier",
    "linear_author_attacker",
    "linear_topic_classifier",
    "run",
]

DEFAULT_EPSILONS = (3.0, 5.0, 8.0, 10.0, 15.0, 25.0)
# WordNet lexicographer categories used as topics: concrete, well separated, each >= 1,259 synsets.
DEFAULT_TOPICS = (
    "noun.animal",
    "noun.plant",
    "noun.food",
    "noun.body",
    "noun.artifact",
    "noun.person",
    "noun.location",
    "noun.substance",
    "verb.motion",
    "verb.communication",
)
CONFIDENCE = 0.95  # two-sided; each Clopper–Pearson bound at (1 + CONFIDENCE) / 2
CLEAN = "clean"
PRIVATIZED = "privatized"


def clean_view(text: str) -> str:
    """The words the device would perturb, joined by spaces (lower case, punctuation dropped)."""
    return " ".join(words(text))


# --- classifiers: fit(texts, labels) then predict(texts) -> labels ---------------------------------------


class KoppelAttacker:
    """Koppel, Schler & Argamon (2011) authorship attribution (the "impostors"/many-candidates method).

    Each candidate's known texts are concatenated into one profile: the term frequencies of its character
    3-4-grams (within words, as scikit-learn's ``char_wb``), over the ``max_features`` n-grams most frequent in
    all known text. An unknown text gets one vote per round for the candidate whose profile is most
    cosine-similar to it on a random ``feature_fraction`` of the features; the most voted candidate wins
    (ties: the larger summed similarity). No training beyond the profiles, as in the paper.
    """

    name = "koppel"

    def __init__(
        self,
        rng: np.random.Generator,
        iterations: int = 100,
        feature_fraction: float = 0.4,
        max_features: int = 20_000,
        ngram_range: tuple[int, int] = (3, 4),
    ) -> None:
        self.rng = rng
        self.iterations = iterations
        self.feature_fraction = feature_fraction
        self.max_features = max_features
        self.ngram_range = ngram_range

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> KoppelAttacker:
        from sklearn.feature_extraction.text import CountVectorizer

        self.classes_ = sorted(set(labels))
        joined = defaultdict(list)
        for t, y in zip(texts, labels):
            joined[y].append(t)
        docs = [" ".join(joined[c]) for c in self.classes_]
        self._vec = CountVectorizer(analyzer="char_wb", ngram_range=self.ngram_range, max_features=self.max_features)
        self._profiles = self._tf(self._vec.fit_transform(docs))
        return self

    @staticmethod
    def _tf(counts):
        """Rows scaled to term frequencies (sparse in, sparse out)."""
        import scipy.sparse as sp

        x = sp.csr_matrix(counts, dtype=np.float64)
        totals = np.asarray(x.sum(axis=1)).ravel()
        return sp.diags(1.0 / np.maximum(totals, 1.0)) @ x

    def predict(self, texts: Sequence[str]) -> list[str]:
        x = self._tf(self._vec.transform(list(texts))).tocsr()
        a = np.asarray(self._profiles.toarray())
        n_feat = a.shape[1]
        k = max(1, round(self.feature_fraction * n_feat))
        masks = np.zeros((self.iterations, n_feat))
        for t in range(self.iterations):
            masks[t, self.rng.choice(n_feat, size=k, replace=False)] = 1.0
        a_norm2 = masks @ (a * a).T  # (iterations, candidates): each profile's squared norm in each subspace
        votes = np.zeros((x.shape[0], a.shape[0]))
        total = np.zeros_like(votes)
        for i in range(x.shape[0]):
            cols = x.indices[x.indptr[i] : x.indptr[i + 1]]
            val = x.data[x.indptr[i] : x.indptr[i + 1]]
            m = masks[:, cols]  # (iterations, n-grams of this text)
            dots = (m * val) @ a[:, cols].T
            denom = np.sqrt((m @ (val * val))[:, None] * a_norm2)
            sim = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
            voted = denom.max(axis=1) > 0  # a round that keeps none of the text's n-grams casts no vote
            np.add.at(votes[i], sim[voted].argmax(axis=1), 1.0)
            total[i] = sim.sum(axis=0)
        return [self.classes_[i] for i in _argmax_tiebreak(votes, total)]


def _argmax_tiebreak(votes: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Row-wise argmax of ``votes``, ties broken by the larger ``total``."""
    scale = float(np.abs(total).max()) + 1.0
    return np.argmax(votes + total / (scale * (votes.shape[1] + 1)), axis=1)


class _Linear:
    """A linear SVM on TF-IDF features (scikit-learn's LinearSVC, C = 1)."""

    def __init__(self, name: str, analyzer: str, ngram_range: tuple[int, int], seed: int) -> None:
        self.name = name
        self.analyzer = analyzer
        self.ngram_range = ngram_range
        self.seed = seed

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> _Linear:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.svm import LinearSVC

        self._vec = TfidfVectorizer(analyzer=self.analyzer, ngram_range=self.ngram_range, sublinear_tf=True)
        x = self._vec.fit_transform(list(texts))
        self._model = LinearSVC(C=1.0, random_state=self.seed, max_iter=5000)
        with warnings.catch_warnings():  # a model short of convergence is still the model an attacker would use
            warnings.simplefilter("ignore", ConvergenceWarning)
            self._model.fit(x, list(labels))
        return self

    def predict(self, texts: Sequence[str]) -> list[str]:
        return [str(y) for y in self._model.predict(self._vec.transform(list(texts)))]


def linear_author_attacker(rng: np.random.Generator) -> _Linear:
    """The modern authorship baseline: linear SVM on character 2-5-gram (within words) TF-IDF."""
    return _Linear("linear", "char_wb", (2, 5), int(rng.integers(2**31)))


def linear_topic_classifier(rng: np.random.Generator) -> _Linear:
    """The topic classifier: linear SVM on word 1-2-gram TF-IDF (fastText's model class: a linear model on
    bags of n-grams)."""
    return _Linear("linear", "word", (1, 2), int(rng.integers(2**31)))


def _koppel(iterations: int) -> Callable[[np.random.Generator], KoppelAttacker]:
    return lambda rng: KoppelAttacker(rng, iterations=iterations)


# --- the evaluation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """Accuracy of one classifier in one setting: ``correct`` of ``n``, chance level, two-sided 95% CI."""

    correct: int
    n: int
    chance: float
    ci_low: float
    ci_high: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    @classmethod
    def of(cls, predicted: Sequence[str], truth: Sequence[str], chance: float) -> Score:
        correct = sum(p == t for p, t in zip(predicted, truth))
        lo, hi = clopper_pearson(correct, len(truth), (1.0 + CONFIDENCE) / 2.0)
        return cls(int(correct), len(truth), chance, lo, hi)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy": self.accuracy}


@dataclass(frozen=True)
class LabelledSplit:
    """Texts of one task (author or topic) split into training (known) and test (unknown) texts."""

    train_texts: list[str]
    train_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]

    def chance(self) -> float:
        """The largest class share of the test set: the accuracy of always guessing that class."""
        counts: dict[str, int] = defaultdict(int)
        for y in self.test_labels:
            counts[y] += 1
        return max(counts.values()) / len(self.test_labels)


def default_localizer_factory(
    vocab_size: int = 50_000, rng: RandomSource | None = None
) -> Callable[[float], Localizer]:
    """ε ↦ the Localizer the presets use (multivariate Laplace over GloVe 6B 50d, ``vocab_size`` words);
    ``rng`` None draws from the OS CSPRNG."""
    emb = glove_default(vocab_size)
    return lambda eps: Localizer(emb, MultivariateLaplace(eps), rng, calibrated=True)


def _settings(epsilons: Sequence[float], presets: bool) -> list[dict[str, Any]]:
    eps = set(map(float, epsilons))
    names = {p.epsilon: p.name for p in PRESETS.values()}
    if presets:
        eps |= set(names)
    return [{"epsilon": None, "preset": None}] + [{"epsilon": e, "preset": names.get(e)} for e in sorted(eps)]


TaskClassifiers = dict[str, Callable[[np.random.Generator], Any]]


def evaluate_splits(
    splits: dict[str, LabelledSplit],
    classifiers: dict[str, TaskClassifiers],
    localizer_factory: Callable[[float], Localizer],
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    *,
    presets: bool = True,
    train_on: Sequence[str] = (CLEAN, PRIVATIZED),
    audit: bool = True,
    rng: np.random.Generator | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every classifier of each task in ``splits`` (e.g. "author", "topic"), trained on clean (and on
    privatized) training texts and tested on clean and privatized test texts at ``epsilons`` (plus the presets'
    ε). Texts are used as ``clean_view`` gives them. Returns a JSON-able dict (see ``evaluate``)."""
    rng = rng if rng is not None else np.random.default_rng()
    say = progress or (lambda _m: None)
    views = {
        t: LabelledSplit(
            [clean_view(x) for x in s.train_texts],
            list(s.train_labels),
            [clean_view(x) for x in s.test_texts],
            list(s.test_labels),
        )
        for t, s in splits.items()
    }
    for t, s in views.items():
        if not all(s.train_texts) or not all(s.test_texts):
            raise ValueError(f"{t}: every text needs at least one word the tokeniser reads (a-z, 0-9)")
        if len(s.train_texts) != len(s.train_labels) or len(s.test_texts) != len(s.test_labels):
            raise ValueError(f"{t}: as many labels as texts are needed")
        if len(set(s.train_labels)) < 2:
            raise ValueError(f"{t}: at least two classes are needed")
    settings = _settings(epsilons, presets)
    tasks: dict[str, Any] = {}
    for t, s in views.items():
        tasks[t] = {
            "classes": len(set(s.train_labels) | set(s.test_labels)),
            "train": len(s.train_texts),
            "test": len(s.test_texts),
            "train_words": sum(len(x.split()) for x in s.train_texts),
            "test_words": sum(len(x.split()) for x in s.test_texts),
            "chance": s.chance(),
            "rows": [],
            "audit": [],
        }
    fitted: dict[tuple[str, str], Any] = {}
    for t, s in views.items():
        for name, make in classifiers[t].items():
            fitted[t, name] = make(rng).fit(s.train_texts, s.train_labels)
            if audit:
                perm = list(rng.permutation(np.array(s.train_labels, dtype=object)))
                shuffled = make(rng).fit(s.train_texts, perm)
                sc = Score.of(shuffled.predict(s.test_texts), s.test_labels, tasks[t]["chance"])
                tasks[t]["audit"].append({"classifier": name, **sc.as_dict()})
    for st in settings:
        eps = st["epsilon"]
        say("clean" if eps is None else f"ε = {eps:g}" + (f" ({st['preset']})" if st["preset"] else ""))
        if eps is None:
            test = {t: s.test_texts for t, s in views.items()}
            train = {t: s.train_texts for t, s in views.items()}
        else:
            loc = localizer_factory(eps)
            want = [(t, "test", s.test_texts) for t, s in views.items()]
            if PRIVATIZED in train_on:
                want += [(t, "train", s.train_texts) for t, s in views.items()]
            flat = [x for _, _, xs in want for x in xs]
            out = [r.text for r in loc.privatize_many(flat)]
            got, k = {}, 0
            for t, part, xs in want:
                got[t, part] = out[k : k + len(xs)]
                k += len(xs)
            test = {t: got[t, "test"] for t in views}
            train = {t: got[t, "train"] for t in views if (t, "train") in got}
            for t, s in views.items():
                n_w = sum(len(x.split()) for x in s.test_texts)
                kept = sum(a == b for x, y in zip(s.test_texts, test[t]) for a, b in zip(x.split(), y.split()))
                st.setdefault("words_kept", {})[t] = kept / max(n_w, 1)
        for t, s in views.items():
            for name, make in classifiers[t].items():
                variants = [CLEAN] if eps is None else list(train_on)
                for how in variants:
                    model = fitted[t, name] if how == CLEAN else make(rng).fit(train[t], s.train_labels)
                    sc = Score.of(model.predict(test[t]), s.test_labels, tasks[t]["chance"])
                    tasks[t]["rows"].append(
                        {"classifier": name, "train_on": how, "epsilon": eps, "preset": st["preset"], **sc.as_dict()}
                    )
    res = {"tasks": tasks, "settings": settings, "confidence": CONFIDENCE}
    res["frontier"] = frontier(res)
    return res


def _best(rows: list[dict], eps: float | None) -> dict | None:
    cand = [r for r in rows if r["epsilon"] == eps]
    return max(cand, key=lambda r: r["accuracy"]) if cand else None


def frontier(res: dict, author_task: str = "author", topic_task: str = "topic") -> list[dict[str, Any]]:
    """Per ε: the best attacker's author accuracy against 2× chance and the best topic classifier's accuracy
    against 90% of its clean value (the issue's target), and whether both hold. Best = over classifiers and
    training variants: what a competent attacker, and a competent analyst, would get."""
    tasks = res["tasks"]
    if author_task not in tasks or topic_task not in tasks:
        return []
    a_rows, t_rows = tasks[author_task]["rows"], tasks[topic_task]["rows"]
    a_chance = tasks[author_task]["chance"]
    t_clean = _best(t_rows, None)
    assert t_clean is not None
    out = []
    for st in res["settings"]:
        if st["epsilon"] is None:
            continue
        a, t = _best(a_rows, st["epsilon"]), _best(t_rows, st["epsilon"])
        assert a is not None and t is not None
        author_ok = a["accuracy"] <= 2 * a_chance
        topic_ok = t["accuracy"] >= 0.9 * t_clean["accuracy"]
        out.append(
            {
                "epsilon": st["epsilon"],
                "preset": st["preset"],
                "author": a["accuracy"],
                "author_ci_high": a["ci_high"],
                "author_by": f"{a['classifier']} trained on {a['train_on']}",
                "author_limit": 2 * a_chance,
                "author_ok": author_ok,
                "author_ok_ci": a["ci_high"] <= 2 * a_chance,
                "topic": t["accuracy"],
                "topic_by": f"{t['classifier']} trained on {t['train_on']}",
                "topic_limit": 0.9 * t_clean["accuracy"],
                "topic_ok": topic_ok,
                "both": author_ok and topic_ok,
            }
        )
    return out


def _stratified(
    texts: Sequence[str], labels: Sequence[str], test_fraction: float, rng: np.random.Generator
) -> LabelledSplit:
    by: dict[str, list[int]] = defaultdict(list)
    for i, y in enumerate(labels):
        by[y].append(i)
    tr, te = [], []
    for y in sorted(by):
        idx = [by[y][j] for j in rng.permutation(len(by[y]))]
        k = max(1, round(test_fraction * len(idx))) if len(idx) > 1 else 0
        te += idx[:k]
        tr += idx[k:]
    return LabelledSplit(
        [texts[i] for i in tr], [labels[i] for i in tr], [texts[i] for i in te], [labels[i] for i in te]
    )


def evaluate(
    texts: Sequence[str],
    *,
    authors: Sequence[str] | None = None,
    topics: Sequence[str] | None = None,
    localizer_factory: Callable[[float], Localizer] | None = None,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    presets: bool = True,
    test_fraction: float = 0.3,
    train_on: Sequence[str] = (CLEAN, PRIVATIZED),
    koppel_iterations: int = 100,
    audit: bool = True,
    rng: np.random.Generator | None = None,
) -> dict[str, Any]:
    """Measure on your own labelled ``texts`` what an attacker can still tell about their authors, and what a
    classifier can still tell about their topics, after the Localizer.

    ``authors`` and/or ``topics`` label each text (the same texts may carry both, as in seed 003). Each task's
    texts are split per class into known (training, ``1 - test_fraction``) and unknown (test) texts; the
    attackers (``koppel``, ``linear``) and the topic classifier (``linear``) are trained on the clean known texts
    — and, with ``train_on`` containing "privatized", on the known texts privatized at the same ε — and tested on
    the unknown texts, clean and privatized by ``localizer_factory(ε)`` (default: the presets' Localizer, see
    ``default_localizer_factory``) at each of ``epsilons`` and each preset's ε. Use texts of similar length to
    what your app sends (a few dozen words or more: one sentence says little about its author even unperturbed).

    Returns a JSON-able dict: ``tasks[task]`` with sizes, ``chance`` and ``rows`` (classifier, train_on,
    epsilon (None = clean), preset, correct, n, accuracy, ci_low, ci_high: two-sided 95% Clopper–Pearson),
    ``audit`` (classifiers trained on shuffled labels, tested on clean text: should be at chance), and
    ``frontier`` (per ε, with both tasks: best author accuracy vs 2× chance, best topic accuracy vs 90% of clean).
    """
    if authors is None and topics is None:
        raise ValueError("give authors=, topics= or both")
    rng = rng if rng is not None else np.random.default_rng()
    splits, classifiers = {}, {}
    if authors is not None:
        splits["author"] = _stratified(texts, [str(a) for a in authors], test_fraction, rng)
        classifiers["author"] = {"koppel": _koppel(koppel_iterations), "linear": linear_author_attacker}
    if topics is not None:
        splits["topic"] = _stratified(texts, [str(t) for t in topics], test_fraction, rng)
        classifiers["topic"] = {"linear": linear_topic_classifier}
    factory = localizer_factory if localizer_factory is not None else default_localizer_factory()
    return evaluate_splits(
        splits, classifiers, factory, epsilons, presets=presets, train_on=train_on, audit=audit, rng=rng
    )


# --- data from packages and the `lac eval` section ---------------------------------------------------


def _shingles(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def _clusters(texts: list[list[str]], n: int) -> list[list[int]]:
    """Groups of texts linked by shared word ``n``-grams (one quotation cited twice, in part), union-find."""
    parent = list(range(len(texts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[str, ...], int] = {}
    for i, toks in enumerate(texts):
        for g in _shingles(toks, n):
            j = owner.setdefault(g, i)
            if j != i:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(texts)):
        groups[find(i)].append(i)
    return list(groups.values())


def snippets(
    texts: list[str], n_snippets: int, words_each: int, rng: np.random.Generator, link_ngram: int | None = 6
) -> list[str]:
    """``n_snippets`` snippets of exactly ``words_each`` words from ``texts`` (one author's or topic's), in random
    order; texts sharing a word ``link_ngram``-gram go into the same snippet (so no snippet quotes another);
    fewer snippets if the texts run out."""
    toks = [words(t) for t in texts]
    groups = _clusters(toks, link_ngram) if link_ngram else [[i] for i in range(len(toks))]
    out: list[str] = []
    cur: list[str] = []
    for g in rng.permutation(len(groups)):
        for i in groups[g]:
            cur += toks[i]
        if len(cur) >= words_each:
            out.append(" ".join(cur[:words_each]))
            cur = []
            if len(out) == n_snippets:
                break
    return out


LABELLED_SETS_VERSION = 1  # bump when a parser in lac.suite.data changes: the cache is rebuilt


def labelled_sets(rebuild: bool = False) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(GCIDE quotations with their authors, WordNet definitions with their categories), parsed once (about 10 s)
    by ``lac.suite.data`` and cached in ``corpora/authorship_sets.json`` under the data directory."""
    import json
    import os

    from lac.suite import data

    path = data.corpora_dir() / "authorship_sets.json"
    key = {"version": LABELLED_SETS_VERSION, "gcide": str(data.GCIDE_DICT), "wordnet": str(data.WORDNET_DIR)}
    if not rebuild:
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if cached["key"] == key:
                return [tuple(q) for q in cached["quotations"]], [tuple(d) for d in cached["definitions"]]  # type: ignore[misc]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    quotes, defs = data.gcide_attributed_quotations(), data.wordnet_topic_definitions()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "quotations": quotes, "definitions": defs}), encoding="utf-8")
    tmp.replace(path)
    return quotes, defs


def authorship_data(cfg, rng: np.random.Generator) -> tuple[dict[str, LabelledSplit], dict[str, Any]]:
    """The author and topic tasks of ``lac eval`` from packages, with what they are and their sizes.

    Authors: GCIDE 0.48 literary quotations (Debian ``dict-gcide``) with their attributions: the
    ``authorship_authors`` authors with the most quoted words (an author whose quotations do not fill the snippets
    is skipped, and said); each author's quotations are shuffled and joined
    into snippets of ``authorship_snippet_words`` words, ``authorship_unknown`` unknown (test) and
    ``authorship_known`` known (training) snippets per author. Topics: WordNet 3.0 definitions (Debian
    ``wordnet-base``) labelled with their lexicographer category, joined the same way into snippets of the
    same length, ``authorship_topic_train`` and ``authorship_topic_test`` per topic.
    """
    n_words = cfg.authorship_snippet_words
    quotes, defs = labelled_sets()
    by_author: dict[str, list[str]] = defaultdict(list)
    for text, author in quotes:
        by_author[author].append(text)
    volume = {a: sum(len(words(t)) for t in ts) for a, ts in by_author.items()}
    need = cfg.authorship_known + cfg.authorship_unknown
    chosen: list[str] = []
    skipped: list[str] = []
    author_split = LabelledSplit([], [], [], [])
    for a in sorted(volume, key=lambda a: (-volume[a], a)):
        if len(chosen) == cfg.authorship_authors or volume[a] < need * n_words:
            break
        sn = snippets(by_author[a], need, n_words, rng)
        if len(sn) < need:  # long quotations linked into few snippets: the next author instead
            skipped.append(a)
            continue
        chosen.append(a)
        author_split.test_texts.extend(sn[: cfg.authorship_unknown])
        author_split.test_labels.extend([a] * cfg.authorship_unknown)
        author_split.train_texts.extend(sn[cfg.authorship_unknown :])
        author_split.train_labels.extend([a] * cfg.authorship_known)
    if len(chosen) < cfg.authorship_authors:
        raise RuntimeError(
            f"GCIDE quotes only {len(chosen)} authors enough for {need} snippets of {n_words} words "
            f"({cfg.authorship_authors} asked for)"
        )
    by_topic: dict[str, list[str]] = defaultdict(list)
    for text, lex in defs:
        by_topic[lex].append(text)
    topic_split = LabelledSplit([], [], [], [])
    t_need = cfg.authorship_topic_train + cfg.authorship_topic_test
    for lex in cfg.authorship_topics:
        sn = snippets(by_topic[lex], t_need, n_words, rng, link_ngram=None)
        if len(sn) < t_need:
            raise RuntimeError(f"WordNet has too few {lex} definitions for {t_need} snippets of {n_words} words")
        topic_split.test_texts.extend(sn[: cfg.authorship_topic_test])
        topic_split.test_labels.extend([lex] * cfg.authorship_topic_test)
        topic_split.train_texts.extend(sn[cfg.authorship_topic_test :])
        topic_split.train_labels.extend([lex] * cfg.authorship_topic_train)
    info = {
        "quotations": len(quotes),
        "quoted_authors": len(by_author),
        "authors": [{"author": a, "quotations": len(by_author[a]), "words": volume[a]} for a in chosen],
        "authors_skipped": skipped,
        "topic_definitions": len(defs),
        "topics": [{"topic": t, "definitions": len(by_topic[t])} for t in cfg.authorship_topics],
        "snippet_words": n_words,
    }
    return {"author": author_split, "topic": topic_split}, info


def run(cfg, out: Path, rng: np.random.Generator) -> dict[str, Any]:
    """The ``lac eval`` section: both tasks from packages, the sweep, the figure ``authorship.png``."""
    import sys

    splits, info = authorship_data(cfg, rng)
    factory = default_localizer_factory(cfg.authorship_embedding_vocab, rng)
    classifiers: dict[str, TaskClassifiers] = {
        "author": {"koppel": _koppel(cfg.authorship_iterations), "linear": linear_author_attacker},
        "topic": {"linear": linear_topic_classifier},
    }
    res = evaluate_splits(
        splits,
        classifiers,
        factory,
        cfg.authorship_epsilons,
        rng=rng,
        progress=lambda m: print(f"  authorship: {m}", file=sys.stderr, flush=True),
    )
    res["data"] = info
    res["embedding"] = f"GloVe 6B 50d, {cfg.authorship_embedding_vocab:,} words"
    res["koppel_iterations"] = cfg.authorship_iterations
    res["figure"] = figure(res, out / "authorship.png").name
    return res


_STYLE = {
    ("koppel", CLEAN): "o-",
    ("koppel", PRIVATIZED): "o--",
    ("linear", CLEAN): "s-",
    ("linear", PRIVATIZED): "s--",
}


def figure(res: dict, path: Path) -> Path:
    """Accuracy vs ε per word for the author attackers (left) and the topic classifier (right), with 95% CIs,
    chance lines, the clean accuracies, the target lines and the presets marked."""
    from . import plots

    fig, axes = plots.new(2, "Authorship vs topic after the Localizer (multivariate Laplace, GloVe 6B 50d)")
    eps_grid = [s["epsilon"] for s in res["settings"] if s["epsilon"] is not None]
    for ax, task, title in zip(axes, ("author", "topic"), ("author identification", "topic classification")):
        tk = res["tasks"][task]
        rows = tk["rows"]
        keys = sorted({(r["classifier"], r["train_on"]) for r in rows if r["epsilon"] is not None})
        for name, how in keys:
            rs = sorted(
                (r for r in rows if (r["classifier"], r["train_on"]) == (name, how) and r["epsilon"]),
                key=lambda r: r["epsilon"],
            )
            x = [r["epsilon"] for r in rs]
            y = np.array([r["accuracy"] for r in rs])
            err = np.array([[r["accuracy"] - r["ci_low"] for r in rs], [r["ci_high"] - r["accuracy"] for r in rs]])
            line = ax.errorbar(
                x, y, yerr=err, fmt=_STYLE.get((name, how), "^-"), ms=4, capsize=2, label=f"{name}, trained on {how}"
            )
            clean = next(r for r in rows if r["classifier"] == name and r["epsilon"] is None)
            if how == CLEAN:
                ax.axhline(clean["accuracy"], color=line[0].get_color(), ls=":", lw=1, label=f"{name} on clean text")
        ax.axhline(tk["chance"], color="k", ls="--", lw=1, label=f"chance {tk['chance']:.3f}")
        if task == "author":
            ax.axhline(2 * tk["chance"], color="r", ls="-.", lw=1, label="target: ≤ 2× chance")
        else:
            best_clean = max(r["accuracy"] for r in rows if r["epsilon"] is None)
            ax.axhline(0.9 * best_clean, color="g", ls="-.", lw=1, label="target: ≥ 90% of clean")
        for s in res["settings"]:
            if s["preset"]:
                ax.axvline(s["epsilon"], color="0.6", lw=0.8)
                ax.text(s["epsilon"], 0.97, f" {s['preset']}", fontsize=7, rotation=90, va="top", color="0.4")
        ax.set_ylim(0, 1)
        ax.set_xscale("log")
        ax.set_xticks(eps_grid, [f"{e:g}" for e in eps_grid])
        ax.minorticks_off()
        ax.set_title(f"{title} ({tk['classes']} classes, {tk['test']} test snippets)", fontsize=9)
        ax.set_ylabel("accuracy (95% CI)")
    return plots.finish(fig, axes, path, xlabel="ε per word (log scale; presets marked)")
