from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

from lac.common.text import BOS, EOS, sentences
from lac.curator.base.ngrams import NgramVocabulary, _ngrams, count_reports, ngrams, report_items, user_counts

PUBLIC = (
    "The cat sat on the mat. The dog sat on the log! Did the cat see the dog? "
    "I don't think the dog saw the cat. The cat ran."
)


def test_ngrams_exact_order_and_boundaries():
    assert list(ngrams(["a", "b"], 3)) == [
        "a",
        "<s> a",
        "b",
        "a b",
        "<s> a b",
        "</s>",
        "b </s>",
        "a b </s>",
    ]
    assert list(ngrams(["a"], 3)) == ["a", "<s> a", "</s>", "a </s>", "<s> a </s>"]
    assert list(ngrams(["a", "b"], 1)) == ["a", "b", "</s>"]
    assert BOS not in ngrams(["x", "y", "z"], 2)


def test_ngrams_counts_match_formula():
    for k in range(1, 7):
        for n in range(1, 5):
            L = k + 2
            expected = sum(max(L - m + 1, 0) for m in range(1, n + 1)) - 1
            assert len(list(ngrams([f"w{i}" for i in range(k)], n))) == expected


def test_ngrams_empty_and_invalid():
    assert list(ngrams([], 3)) == []
    for bad in (["a b"], ["a", ""], ["<s>"], ["a", "</s>"], ["tab\t"], [" a"]):
        with pytest.raises(ValueError):
            ngrams(bad, 3)
    for bad_n in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            ngrams(["a"], bad_n)


def test_vocabulary_from_sentences():
    sents = sentences(PUBLIC)
    v = NgramVocabulary.from_sentences(sents, max_n=3)
    expected = Counter(g for s in sents for g in ngrams(s, 3))
    assert dict(zip(v.items, v.alpha)) == expected
    assert v.alpha.dtype == np.float64
    assert list(v.alpha) == sorted(v.alpha, reverse=True)
    assert v.items[0] == "the"  # most frequent
    assert v.index["cat"] == v.items.index("cat")
    assert v.order("<s> the cat") == 3 and v.order("</s>") == 1
    assert list(v.orders) == [len(it.split(" ")) for it in v.items]
    assert "<s>" not in v.index and "</s>" in v.index
    v2 = NgramVocabulary.from_sentences(sents, max_n=2, min_count=2, max_items=5)
    assert len(v2) == 5 and v2.alpha.min() >= 2 and max(v2.orders) <= 2
    # ties broken by item text: deterministic
    assert v2.items == NgramVocabulary.from_sentences(list(reversed(sents)), 2, 2, 5).items


def test_vocabulary_validation():
    with pytest.raises(ValueError):
        NgramVocabulary(("a", "a"), np.ones(2), 3)
    with pytest.raises(ValueError):
        NgramVocabulary(("a b c d",), np.ones(1), 3)
    with pytest.raises(ValueError):
        NgramVocabulary(("a  b",), np.ones(1), 3)
    with pytest.raises(ValueError):
        NgramVocabulary(("a",), np.ones(2), 3)
    with pytest.raises(ValueError):
        NgramVocabulary(("a",), -np.ones(1), 3)


@pytest.mark.parametrize("n_items", [2, 40])  # a dict lookup for few items, a hash join for many
def test_columns_of_items(n_items):
    vocab = NgramVocabulary(tuple(f"w{j}" for j in range(30)) + ("a b", "é ü"), np.ones(32), 2)
    rng = np.random.default_rng(n_items)
    names = [f"w{j}" for j in rng.integers(0, 60, n_items)]
    names[:2] = ["é ü", "a  b"]
    want = [vocab.index.get(it, -1) for it in names]
    got = vocab.columns(tuple(names))
    assert got.dtype == np.int64 and got.tolist() == want
    assert vocab.columns(()).shape == (0,)


def test_pickle_leaves_out_the_cached_lookups():
    import pickle

    vocab = NgramVocabulary(tuple(f"w{j}" for j in range(500)) + ("w1 w2",), np.arange(501.0), 2)
    plain = len(pickle.dumps(vocab))
    assert vocab.index["w1 w2"] == 500 and vocab.words  # cached now
    assert vocab.columns(tuple(vocab.items)).tolist() == list(range(501))
    back = pickle.loads(pickle.dumps(vocab))
    assert len(pickle.dumps(vocab)) == plain and "index" not in back.__dict__
    assert back.items == vocab.items and back.max_n == 2 and np.array_equal(back.alpha, vocab.alpha)
    assert back.order("w1 w2") == 2 and back.index == vocab.index and back.words == vocab.words


def test_save_load_roundtrip(tmp_path):
    v = NgramVocabulary.from_sentences(sentences(PUBLIC + " Ünïcode wörds here."), max_n=3)
    p = tmp_path / "vocab.bin"
    v.save(p)
    assert p.exists() and not (tmp_path / "vocab.bin.npz").exists()
    w = NgramVocabulary.load(p)
    assert w.items == v.items and w.max_n == v.max_n
    np.testing.assert_array_equal(w.alpha, v.alpha)
    e = NgramVocabulary((), np.zeros(0), 2)
    e.save(tmp_path / "empty.npz")
    assert len(NgramVocabulary.load(tmp_path / "empty.npz")) == 0


def reference_counts(reports, vocab, C, W):
    """Literal per-report rule: n-grams in ngrams() order, drop OOV, first W distinct, clamp C."""
    rows, n_ng, n_oov, n_cap, n_clamp = [], 0, 0, 0, 0
    for rep in reports:
        cnt, first = Counter(), []
        for s in rep:
            toks = [t if t not in (BOS, EOS) else "\x00" for t in s]  # in-sentence markers: OOV
            for g in ngrams([t if t != "\x00" else "OOV\x01" for t in toks], vocab.max_n):
                n_ng += 1
                if g not in vocab.index:
                    n_oov += 1
                    continue
                if g not in cnt:
                    first.append(g)
                cnt[g] += 1
        keep = first if W is None else first[:W]
        n_cap += len(first) - len(keep)
        row = {}
        for g in keep:
            row[vocab.index[g]] = min(cnt[g], C)
            n_clamp += max(cnt[g] - C, 0)
        rows.append(row)
    M = np.zeros((len(reports), len(vocab)), dtype=np.int64)
    for i, row in enumerate(rows):
        for j, c in row.items():
            M[i, j] = c
    return M, n_ng, n_oov, n_cap, n_clamp


WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "zebra", "quokka", BOS, EOS]


def random_reports(rng, n):
    reps = []
    for _ in range(n):
        reps.append(
            [
                list(
                    rng.choice(
                        WORDS, size=rng.integers(0, 6), p=[0.2, 0.15, 0.1, 0.1, 0.1, 0.1, 0.09, 0.05, 0.05, 0.03, 0.03]
                    )
                )
                for _ in range(rng.integers(0, 4))
            ]
        )
    return reps


@pytest.mark.parametrize("seed", range(40))
def test_user_counts_match_reference(seed):
    rng = np.random.default_rng(seed)
    max_n = int(rng.integers(1, 5))
    vocab = NgramVocabulary.from_sentences(sentences(PUBLIC), max_n=max_n, max_items=int(rng.integers(1, 80)))
    reps = random_reports(rng, int(rng.integers(0, 30)))
    C = int(rng.integers(1, 4))
    W = None if rng.random() < 0.3 else int(rng.integers(1, 8))
    res = count_reports(reps, vocab, C, W, chunk_size=int(rng.integers(1, 10)))
    M, n_ng, n_oov, n_cap, n_clamp = reference_counts(reps, vocab, C, W)
    assert res.matrix.shape == (len(reps), len(vocab))
    assert res.matrix.dtype == np.int32
    np.testing.assert_array_equal(res.matrix.toarray(), M)
    assert (res.n_ngrams, res.n_out_of_vocab, res.n_over_cap, res.n_clamped) == (n_ng, n_oov, n_cap, n_clamp)
    m = res.matrix.copy()
    m.has_canonical_format = False
    m.sum_duplicates()
    np.testing.assert_array_equal(m.indices, res.matrix.indices)  # really canonical
    assert (res.matrix.data > 0).all()


def test_user_counts_on_text():
    vocab = NgramVocabulary.from_sentences(sentences(PUBLIC), max_n=3)
    reports = [sentences("The cat sat on the mat. The cat sat."), sentences(""), sentences("Zebras ran.")]
    U = user_counts(reports, vocab, C=1, W=None)
    assert U.shape == (3, len(vocab))
    row = {vocab.items[j]: c for j, c in zip(U[0].indices, U[0].data)}
    assert row["the cat sat"] == 1 and row["<s> the cat"] == 1 and row["mat </s>"] == 1 and "sat </s>" not in row
    assert U[1].nnz == 0
    assert {vocab.items[j] for j in U[2].indices} == {"ran", "</s>", "ran </s>"}
    U2 = user_counts(reports, vocab, C=2, W=None)
    assert U2[0, vocab.index["the cat sat"]] == 2 and U2[0, vocab.index["mat"]] == 1
    # W keeps the first items in reading order of their last token
    U3 = user_counts(reports, vocab, C=2, W=3)
    assert {vocab.items[j] for j in U3[0].indices} == {"the", "<s> the", "cat"}


def test_user_counts_edge_cases():
    vocab = NgramVocabulary.from_sentences(sentences(PUBLIC), max_n=2)
    U = user_counts([], vocab, C=1, W=None)
    assert U.shape == (0, len(vocab)) and sp.issparse(U)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            user_counts([], vocab, C=bad, W=None)
        with pytest.raises(ValueError):
            user_counts([], vocab, C=1, W=bad)
    with pytest.raises(TypeError):
        user_counts(["a sentence as a string"], vocab, 1, None)
    empty_vocab = NgramVocabulary((), np.zeros(0), 2)
    res = count_reports([[["a", "b"]]], empty_vocab, 1, None)
    assert res.matrix.shape == (1, 0) and res.n_out_of_vocab == res.n_ngrams == 6


def test_key_table_matches_binary_search():
    from lac.curator.base.ngrams import _KeyTable

    rng = np.random.default_rng(0)
    for m in (0, 1, 2, 7, 1000, 50000):
        keys = np.unique(rng.integers(0, 10**12, m))
        table = _KeyTable(keys)
        q = np.concatenate([keys, rng.integers(0, 10**12, 3000), keys[:5] + 1]) if keys.size else rng.integers(0, 9, 10)
        pos = np.searchsorted(keys, q)
        want = np.where(
            (pos < keys.size) & (keys[np.minimum(pos, max(keys.size - 1, 0))] == q) if keys.size else False, pos, -1
        )
        np.testing.assert_array_equal(table.find(q), want)


@pytest.mark.parametrize("seed", range(30))
def test_report_items_match_enumerating_each_report(seed):
    """Per report, its items in order of first occurrence in ``ngrams``'s enumeration, with their counts;
    the dictionary holds each item once (whatever its internal order)."""
    rng = np.random.default_rng(seed)
    max_n = int(rng.integers(1, 5))
    reps = random_reports(rng, int(rng.integers(0, 40)))
    got = report_items(reps, max_n)
    assert len(set(got.items)) == len(got.items)
    for r, rep in enumerate(reps):
        want = Counter(g for s in rep for g in _ngrams(list(map(str, s)), max_n))  # (the tokens may be <s>, </s>)
        row = slice(got.indptr[r], got.indptr[r + 1])
        assert [got.items[i] for i in got.item_ids[row]] == list(want)  # Counter keeps first-occurrence order
        assert got.counts[row].tolist() == list(want.values())


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda v: ngrams(["a"], max_n=0), "max_n"),
        (lambda v: NgramVocabulary.from_sentences([["a"]], max_n=1, min_count=0), "min_count"),
        (lambda v: NgramVocabulary.from_sentences([["a"]], max_n=1, max_items=-1), "max_items"),
        (lambda v: count_reports([[["a"]]], v, 0, None), "C"),
        (lambda v: count_reports([[["a"]]], v, 1, True), "W"),
        (lambda v: count_reports([[["a"]]], v, 1, 2, chunk_size=0), "chunk_size"),
    ],
)
def test_whole_number_arguments_are_checked_by_check_int(call, name):
    """Whole-number arguments go through ``lac.common.checks.check_int`` (one message for all)."""
    vocab = NgramVocabulary.from_sentences([["a", "b"]], max_n=1)
    with pytest.raises(ValueError, match=f"^{name} must be an integer >= "):
        call(vocab)
