"""The Localizer: per-word perturbation of texts, OOV handling, reports, metric-DP ratios.

Statistical checks use fixed seeds and reject at p < 1e-3 (family-wise where stated), so a
correct implementation would fail each with probability at most 1e-3 under a fresh seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lac.client import localizer as loc_mod
from lac.client.embedding import Embedding
from lac.client.errors import UnsupportedText
from lac.client.localizer import OOV, Localizer, PrivatizedReport
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import nearest_rows, sqdist64
from lac.common.text import sentences

P_MIN = 1e-3
TEXT = "The king doesn't like Zqxvort's florbnitz. He said it's 12345678901234 times worse!\n\nOk."
OOV_TOKENS = {"zqxvort", "florbnitz", "12345678901234"}


def _loc(emb, eps, seed=0):
    return Localizer(emb, MultivariateLaplace(eps), np.random.default_rng(seed))


def test_report_fields(glove50k):
    loc = _loc(glove50k, 4.0)
    r = loc.privatize(TEXT)
    src = sentences(TEXT)
    assert isinstance(r, PrivatizedReport)
    assert [len(s) for s in r.sentences] == [len(s) for s in src]
    assert r.n_words == sum(len(s) for s in src) == 16
    assert (r.mechanism, r.epsilon_per_word, r.embedding) == ("multivariate-laplace", 4.0, "glove-6b-50d/50000")
    assert "n = 16" in r.statement and "centroid" in r.statement and glove50k.name in r.statement
    assert f"{16 * 4.0 * glove50k.diameter():.6g}" in r.statement
    assert loc.local_epsilon(16) == 16 * 4.0 * glove50k.diameter()
    # Only tokens leave: every field is a string, a number or tuples of strings.
    assert all(isinstance(t, str) for s in r.sentences for t in s)
    assert isinstance(r.sentences, tuple) and all(isinstance(s, tuple) for s in r.sentences)


def test_report_explains_itself_briefly(glove50k):
    """A short repr (not the dataclass's kilobytes of guarantees) and a plain-language explain()."""
    r = _loc(glove50k, 8.0).privatize(TEXT)
    assert repr(r) == "PrivatizedReport(16 words, ε=8/word, glove-6b-50d/50000)"
    one = _loc(glove50k, 8.0).privatize("hello")
    assert repr(one) == "PrivatizedReport(1 word, ε=8/word, glove-6b-50d/50000)"
    text = r.explain()
    assert "each of the 16 words" in text and "ε = 8 per word" in text
    assert "the original text never leaves the device" in text and "sealed" in text
    assert 2 <= text.count(". ") + 1 <= 4 and len(text) < 600  # a few sentences, no formal statement
    assert "metric" not in text and "δ" not in text


@pytest.mark.parametrize(
    ("texts", "match"),
    [
        ([b"hello world"], r"^the text is bytes: decode it to str first"),
        ([None], r"^the text is NoneType, not str"),
        (["hello", 3], r"^text 2 of 2 is int, not str"),
        ("hello world", r"^privatize_many takes a list of texts"),
        (b"hello world", r"^privatize_many takes a list of texts"),
    ],
)
def test_text_that_is_not_str_is_a_clear_type_error(glove200, texts, match):
    with pytest.raises(TypeError, match=match):
        _loc(glove200, 1.0).privatize_many(texts)


def test_privatize_refuses_bytes_and_none(glove200):
    with pytest.raises(TypeError, match="decode it to str first"):
        _loc(glove200, 1.0).privatize(b"hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="NoneType, not str"):
        _loc(glove200, 1.0).privatize(None)  # type: ignore[arg-type]


def test_maximum_text_size(glove200):
    """MAX_TEXT_CHARS is the longest text taken; one character more is a ValueError naming the limit."""
    from lac.client import MAX_TEXT_CHARS

    loc = _loc(glove200, 1.0)
    longest = ("the " * MAX_TEXT_CHARS)[:MAX_TEXT_CHARS]
    assert loc.privatize(longest).n_words > 0
    with pytest.raises(ValueError, match=r"^text 2 of 2 has 100,001 characters, more than the 100,000"):
        loc.privatize_many(["hello", longest + "x"])


def test_empty_text(glove200):
    """A text without words is refused (it would be an empty report); no texts give no reports."""
    with pytest.raises(UnsupportedText, match="^the text has no word to privatize"):
        _loc(glove200, 1.0).privatize("  ... !!")
    assert _loc(glove200, 1.0).privatize_many([]) == []


def test_unsupported_texts_raise_or_are_skipped_in_place(glove50k):
    """``on_unsupported="raise"`` (the default) refuses the batch naming the text; ``"skip"`` returns None where
    its report would be, so the result lines up with the texts; with long texts split, each report's
    ``text_index`` names its text."""
    from lac.common.deployment import Deployment

    texts = ["the king", "你好，世界。", "🙂🎉", "the queen spoke"]
    loc = _loc(glove50k, 1e6)  # no noise: each word comes out as itself
    with pytest.raises(UnsupportedText, match="^text 2 of 4 has no word") as err:
        loc.privatize_many(texts)
    assert err.value.index == 1
    got = loc.privatize_many(texts, on_unsupported="skip")
    assert [r and r.text for r in got] == ["the king", None, None, "the queen spoke"]
    assert [r.text_index for r in got if r is not None] == [0, 3]
    assert loc.privatize_many(["🙂"], on_unsupported="skip") == [None]
    with pytest.raises(ValueError, match="on_unsupported must be 'raise' or 'skip', got 'drop'"):
        loc.privatize_many(texts, on_unsupported="drop")  # type: ignore[call-overload]
    d = Deployment(
        epsilon_per_word=1e6, embedding=glove50k.name, word_distance_bound=glove50k.diameter(), max_report_words=2
    )
    split = Localizer(glove50k, MultivariateLaplace(1e6), deployment=d, long_text="split", calibrated=True)
    got = split.privatize_many(["one two three four five", "🙂", "six"], on_unsupported="skip")
    want = [(0, "one two"), (0, "three four"), (0, "five"), None, (2, "six")]
    assert [r and (r.text_index, r.text) for r in got] == want


def test_a_text_partly_in_another_script_is_privatized_on_its_words_with_one_warning(glove50k):
    """Letters of another script (or accented ones) besides words of a-z and 0-9: the words are privatized, the
    rest dropped, and one ``PartlyUnsupportedText`` names every such text (pointing at the caller's line); only
    a text with no word at all is ``UnsupportedText``."""
    from lac.client.errors import LacClientWarning, PartlyUnsupportedText

    loc = _loc(glove50k, 1e6)
    with pytest.warns(PartlyUnsupportedText, match="^the text has letters or digits outside a-z and 0-9") as caught:
        report = loc.privatize("hello 世界 world")
    assert report.text == "hello world" and report.n_words == 2
    assert caught[0].filename == __file__  # the caller's line, not the SDK's
    texts = ["the king", "我有3个苹果", "café au lait", "the queen", "Привет, Bob"]
    with pytest.warns(PartlyUnsupportedText) as caught:
        reports = loc.privatize_many(texts)
    (warning,) = caught
    assert isinstance(warning.message, LacClientWarning) and isinstance(warning.message, UserWarning)
    assert warning.message.indexes == (1, 2, 4) and warning.message.total == 5
    assert str(warning.message).startswith("3 of 5 texts (text 2, 3, 5) have letters or digits outside a-z and 0-9")
    assert [r.n_words for r in reports] == [2, 1, 3, 2, 1]  # "caf", "au", "lait": é separates words
    assert [reports[i].text for i in (1, 4)] == ["3", "bob"]
    assert loc.privatize_many(["the king", "12 o'clock"])  # nothing unread: no warning (warnings fail tests)


@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0, 1e6])
def test_oov_never_passes_through(glove50k, eps):
    loc = _loc(glove50k, eps, seed=int(eps * 10))
    for r in loc.privatize_many([TEXT] * 20):
        out = {t for s in r.sentences for t in s}
        assert not out & OOV_TOKENS
        assert all(t in glove50k.index for t in out)


def test_oov_words_start_from_the_centroid(glove50k):
    # With negligible noise every OOV word lands on the vocabulary word nearest the centroid,
    # and in-vocabulary words stay themselves (checks the id <-> row bookkeeping).
    loc = _loc(glove50k, 1e6)
    r = loc.privatize(TEXT)
    centre_word = glove50k.words[nearest_rows(glove50k.centroid[None, :], glove50k.vectors)[0]]
    expected = [[centre_word if t in OOV_TOKENS else t for t in s] for s in sentences(TEXT)]
    assert [list(s) for s in r.sentences] == expected


def test_small_epsilon_changes_words(glove50k):
    r = _loc(glove50k, 0.1, seed=2).privatize("the king said that the queen was in the palace " * 10)
    src = [t for s in sentences("the king said that the queen was in the palace " * 10) for t in s]
    out = [t for s in r.sentences for t in s]
    assert np.mean([a == b for a, b in zip(src, out)]) < 0.2


def test_privatize_many_equals_privatize_when_noise_is_negligible(glove50k, monkeypatch):
    texts = [TEXT, "hello world.", "Another text; with words! And more words."]
    loc = _loc(glove50k, 1e6)
    single = [loc.privatize(t) for t in texts]
    monkeypatch.setattr(loc_mod, "_CHUNK", 5)  # several noise/NN passes over the flattened words
    assert loc.privatize_many(iter(texts)) == single


def test_privatize_many_same_distribution_as_privatize(glove200):
    # Chi-square homogeneity of the output word of "said" between the two entry points.
    n = 3000
    batch = _loc(glove200, 5.0, seed=1).privatize_many(["said"] * n)
    single_loc = _loc(glove200, 5.0, seed=2)
    single = [single_loc.privatize("said") for _ in range(n)]
    a = np.bincount([glove200.index[r.sentences[0][0]] for r in batch], minlength=glove200.size)
    b = np.bincount([glove200.index[r.sentences[0][0]] for r in single], minlength=glove200.size)
    keep = (a + b) >= 20
    table = np.stack([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    assert keep.sum() >= 5  # outputs are spread, so the test has power
    assert stats.chi2_contingency(table).pvalue > P_MIN


def test_privatize_many_reports_progress_and_returns_the_same_reports(glove50k, monkeypatch):
    texts = [TEXT, "hello world.", "Another text; with words! And more words."] * 5
    want = _loc(glove50k, 1e6).privatize_many(texts)
    monkeypatch.setattr(loc_mod, "_HOOK_CHUNK", 7)  # many passes
    monkeypatch.setattr(loc_mod, "PROGRESS_INTERVAL", 0.0)  # a call at every check
    calls: list[tuple[int, int]] = []
    got = _loc(glove50k, 1e6).privatize_many(texts, progress=lambda done, total: calls.append((done, total)))
    assert got == want
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {len(texts)} and done == sorted(done) and calls[-1] == (len(texts), len(texts))
    assert 0 < done[len(done) // 2] < len(texts)  # texts are counted as their words are perturbed


def test_progress_is_called_at_a_bounded_frequency(glove200, monkeypatch):
    clock = iter(np.arange(0.0, 1e6, 0.03))  # each look at the clock: 30 ms later
    monkeypatch.setattr(loc_mod, "_clock", lambda: next(clock))
    monkeypatch.setattr(loc_mod, "_HOOK_CHUNK", 3)
    seen: list[float] = []
    _loc(glove200, 5.0).privatize_many(["the king said"] * 200, progress=lambda d, t: seen.append(next(clock)))
    gaps = np.diff(seen[:-1])  # the last call (the end) comes whenever the run ends
    assert len(seen) > 5 and (gaps >= loc_mod.PROGRESS_INTERVAL).all()


def test_a_cancelled_run_raises_cancelled_and_returns_nothing(glove200, monkeypatch):
    import threading

    import lac.client

    monkeypatch.setattr(loc_mod, "_HOOK_CHUNK", 5)
    monkeypatch.setattr(loc_mod, "PROGRESS_INTERVAL", 0.0)
    texts = ["the king said hello to the queen"] * 40
    loc = _loc(glove200, 5.0)
    calls: list[int] = []

    def stop_after_three(done, total):
        calls.append(done)
        return len(calls) < 3

    with pytest.raises(lac.client.Cancelled) as err:
        loc.privatize_many(texts, progress=stop_after_three)
    assert isinstance(err.value, lac.client.LacClientError) and err.value.code() is None
    assert len(calls) == 3 and err.value.done == calls[-1] < 40 and err.value.total == 40
    assert str(err.value) == (
        f"privatize_many was cancelled (the progress callback returned False) after {calls[-1]} of 40 texts: "
        "nothing was returned and nothing was sent"
    )
    event = threading.Event()
    event.set()
    with pytest.raises(lac.client.Cancelled, match=r"\(the cancel event was set\) after 0 of 40 texts") as err:
        loc.privatize_many(texts, cancel=event)
    assert err.value.done == 0
    event = threading.Event()  # set while the run goes on (as by another thread): stops at the next pass
    with pytest.raises(lac.client.Cancelled) as err:
        loc.privatize_many(texts, progress=lambda done, total: event.set() if done >= 10 else None, cancel=event)
    assert 10 <= err.value.done < 40
    assert loc.privatize_many(texts[:2], progress=lambda d, t: None, cancel=threading.Event())  # no cancel: reports
    with pytest.raises(UnsupportedText):  # the texts are still checked first
        loc.privatize_many(["the king", "🙂"], cancel=threading.Event())


def test_perturb_ids(glove200):
    loc = _loc(glove200, 1e6)
    ids = np.array([0, 5, 199, 42, OOV])
    out = loc.perturb_ids(ids)
    assert out.dtype == np.int64 and list(out[:4]) == [0, 5, 199, 42]
    assert 0 <= out[4] < glove200.size
    assert loc.perturb_ids(np.array([], dtype=np.int64)).shape == (0,)
    for bad in (np.array([200]), np.array([-2]), np.array([[1, 2]]), np.array([0.5])):
        with pytest.raises(ValueError):
            loc.perturb_ids(bad)
    np.testing.assert_array_equal(loc.ids(["the", "zqxvort"]), [glove200.index["the"], OOV])


def test_default_rng_is_fresh_csprng(glove200):
    a = Localizer(glove200, MultivariateLaplace(1.0))
    b = Localizer(glove200, MultivariateLaplace(1.0))
    from lac.common.rng import CsprngGenerator

    assert isinstance(a.rng, CsprngGenerator)  # every bit from a ChaCha20 stream keyed by os.urandom
    assert not np.array_equal(a.rng.random(4), b.rng.random(4))


def _ratio_violations(a, b, n, bound, alpha):
    """Outputs y where the data contradicts p_a(y) <= bound * p_b(y) (Clopper-Pearson, Bonferroni).

    Under the hypothesis, the family-wise false-alarm rate is at most ``alpha``.
    """
    k = 2 * len(a)
    q = alpha / (2 * k)
    hits = a > 0
    lower_a = np.zeros(len(a))
    lower_a[hits] = stats.beta.ppf(q, a[hits], n - a[hits] + 1)
    upper_b = np.ones(len(b))
    below = b < n
    upper_b[below] = stats.beta.ppf(1 - q, b[below] + 1, n - b[below])
    return np.flatnonzero(lower_a > bound * upper_b)


@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_metric_dp_ratio_on_real_vocabulary(glove200, eps):
    # The two closest of the 200 most frequent GloVe words, where the bound is tightest.
    # A sanity check only: in 50 dimensions nearest-word outputs stay far inside the bound
    # (even 7x too little noise passes), so calibration is tested in one dimension below.
    v = glove200.vectors.astype(np.float64)
    dist = np.sqrt(sqdist64(v[:, None, :], v[None, :, :]))
    np.fill_diagonal(dist, np.inf)
    w, w2 = np.unravel_index(np.argmin(dist), dist.shape)
    bound = np.exp(eps * dist[w, w2])
    loc = _loc(glove200, eps, seed=int(eps))
    n = 100_000
    a = np.bincount(loc.perturb_ids(np.full(n, w)), minlength=glove200.size)
    b = np.bincount(loc.perturb_ids(np.full(n, w2)), minlength=glove200.size)
    # Both directions share the family-wise rate 1e-3.
    assert _ratio_violations(a, b, n, bound, P_MIN / 2).size == 0
    assert _ratio_violations(b, a, n, bound, P_MIN / 2).size == 0


def test_metric_dp_ratio_is_attained_in_one_dimension():
    # Vocabulary 0, .5, 1, 1.5, 2 on a line. For the output "2" (y > 1.75) the noise density
    # ratio of inputs 0 and .5 is exactly exp(eps * .5) at every y, so the output ratio must
    # equal the metric-DP bound: this catches a mis-scaled epsilon, not just a violation.
    emb = Embedding("line", list("abcde"), np.arange(5, dtype=np.float32)[:, None] / 2)
    eps, n = 2.0, 200_000
    loc = _loc(emb, eps, seed=9)
    a = np.bincount(loc.perturb_ids(np.zeros(n, dtype=np.int64)), minlength=5)
    b = np.bincount(loc.perturb_ids(np.ones(n, dtype=np.int64)), minlength=5)
    bound = np.exp(eps * 0.5)
    assert _ratio_violations(a, b, n, bound, P_MIN / 2).size == 0
    assert _ratio_violations(b, a, n, bound, P_MIN / 2).size == 0
    # Conditional on b4 + a4, b4 ~ Binomial(a4 + b4, e / (1 + e)).
    assert stats.binomtest(b[4], a[4] + b[4], bound / (1 + bound)).pvalue > P_MIN


@pytest.mark.slow
def test_metric_dp_ratio_many_pairs(glove200):
    # Ten random pairs at eps = 2 with 200k samples each; family-wise false alarm 1e-3 overall.
    rng = np.random.default_rng(77)
    v = glove200.vectors.astype(np.float64)
    loc = _loc(glove200, 2.0, seed=78)
    n, pairs = 200_000, rng.choice(glove200.size, size=(10, 2), replace=False)
    for w, w2 in pairs:
        bound = np.exp(2.0 * np.sqrt(sqdist64(v[w], v[w2])))
        a = np.bincount(loc.perturb_ids(np.full(n, w)), minlength=glove200.size)
        b = np.bincount(loc.perturb_ids(np.full(n, w2)), minlength=glove200.size)
        assert _ratio_violations(a, b, n, bound, P_MIN / 20).size == 0
        assert _ratio_violations(b, a, n, bound, P_MIN / 20).size == 0


def test_report_metadata_states_every_guarantee(glove50k):
    r = _loc(glove50k, 4.0).privatize(TEXT)
    md = r.metadata
    assert md["embedding"] == {
        "name": glove50k.name,
        "size": 50_000,
        "dim": 50,
        "diameter": glove50k.diameter(),
        "source": glove50k.source,
        "license": "PDDL-1.0",
    }
    assert md["n_words"] == 16 and md["epsilon_per_word"] == 4.0
    assert md["report_epsilon_times_max_distance"] == 64.0
    assert "ℓ·ε = 64" in md["report_composition"] and "ℓ·ε = 64" in r.statement
    assert "Earth Mover" in md["bag_earth_movers"] and "ℓ = 16" in md["bag_earth_movers"]
    assert md["local_epsilon_worst_case"] == 16 * 4.0 * glove50k.diameter()
    assert "never passed through" in md["out_of_vocabulary"]
    assert md["per_word_guarantee"] in r.statement
    import json

    json.dumps(md)  # JSON-able as printed by `lac client privatize --json`


def test_bag_earth_movers_guarantee_is_attained_in_one_dimension():
    # Seed 003, Thm 3.1: bags of equal size l satisfy eps*l*E(b,b')-privacy.  On the line
    # 0, .5, 1, 1.5, 2 take b = {0, 1} and b' = {1, .5}: the best matching (0-.5, 1-1) costs
    # l*E = .5, while matching positions (0-1, 1-.5) would cost 1.5.  The output bag {2, 2}
    # attains exp(eps * .5) exactly, so the test catches a mis-stated bag bound.  One family
    # at false-alarm rate 1e-3 (ratio checks) plus one binomial test at 1e-3.
    emb = Embedding("line", list("abcde"), np.arange(5, dtype=np.float32)[:, None] / 2)
    eps, n = 2.0, 200_000
    loc = _loc(emb, eps, seed=10)

    def bags(rows):
        out = loc.perturb_ids(np.tile(rows, n)).reshape(n, 2)
        return np.bincount(out.min(axis=1) * 5 + out.max(axis=1), minlength=25)

    a, b = bags([0, 2]), bags([2, 1])
    bound = np.exp(eps * 0.5)
    assert _ratio_violations(a, b, n, bound, P_MIN / 2).size == 0
    assert _ratio_violations(b, a, n, bound, P_MIN / 2).size == 0
    top = 4 * 5 + 4
    assert stats.binomtest(b[top], a[top] + b[top], bound / (1 + bound)).pvalue > P_MIN  # b' is nearer 2


def test_sealed_content_holds_only_what_the_statements_disclose(glove50k, curator_public_key):
    """Finding 2: the seal carried n_out_of_vocabulary (the curator told an OOV sentence from an
    in-vocabulary one with certainty) and ~1.6 KB of prose. Now the sealed content is the report id,
    the perturbed words and three typed parameters; nothing depends on which words were OOV."""
    from lac.client.submit import report_content
    from lac.common import envelope
    from lac.common.v1 import reports_pb2

    assert "n_out_of_vocabulary" not in reports_pb2.ReportContent.DESCRIPTOR.fields_by_name
    loc = _loc(glove50k, 15.0, seed=3)
    a = report_content(loc.privatize("the cat sat on the mat ."))
    b = report_content(loc.privatize("the xqzvwk sat on the mat ."))
    for c in (a, b):
        assert {f.name for f, _ in c.ListFields()} == {"report_id", "sentences", "local_privacy"}
        assert len(c.report_id) == 16 and c.local_privacy == a.local_privacy
        assert [len(s.tokens) for s in c.sentences] == [6]
    assert a.local_privacy.epsilon_per_word == 15.0 and a.local_privacy.embedding == glove50k.name
    # the statement is rendered locally from the same typed values, and never sealed
    assert "statement" not in reports_pb2.LocalPrivacy.DESCRIPTOR.fields_by_name
    sealed = envelope.seal(a, curator_public_key)
    assert len(sealed.data) == 32 + 512 + 16  # the smallest padding bucket


def test_a_median_report_seals_to_the_smallest_bucket(glove50k, curator_public_key):
    """Seal size of real 17-word messages (the demo's median report length): <= 600 B."""
    from lac.client.submit import report_content
    from lac.common import envelope

    texts = [
        "I never said I was perfect, but I am a lot better than the people you usually meet here.",
        "The quick brown fox jumps over the lazy dog while the farmer watches from the old red barn.",
    ]
    for r in _loc(glove50k, 15.0, seed=4).privatize_many(texts):
        assert 17 <= r.n_words <= 19
        assert len(envelope.seal(report_content(r), curator_public_key).data) <= 600


def test_deployment_is_enforced_on_the_device(glove50k):
    """Finding 5: ε0 was an operator-typed number. The Localizer now refuses a mechanism, ε or
    embedding the deployment does not accept and keeps each report within its L words."""
    from lac.client.localizer import fit_words
    from lac.common.deployment import Deployment

    d = Deployment(
        epsilon_per_word=10.0, embedding=glove50k.name, word_distance_bound=glove50k.diameter(), max_report_words=5
    )
    for bad in (
        dict(epsilon_per_word=5.0),
        dict(embedding="glove-6b-50d/20000"),
        dict(mechanism="knn-truncated"),
        dict(word_distance_bound=10.0),
    ):
        with pytest.raises(ValueError, match="does not match the curator's deployment"):
            Localizer(glove50k, MultivariateLaplace(10.0), deployment=Deployment(**{**d.__dict__, **bad}))
    text = "One two three. Four five six seven. Eight nine ten eleven twelve thirteen fourteen."
    trunc = Localizer(glove50k, MultivariateLaplace(10.0), deployment=d)
    assert [r.n_words for r in trunc.privatize_many([text])] == [5]
    split = Localizer(glove50k, MultivariateLaplace(10.0), deployment=d, long_text="split")
    parts = split.privatize_many([text, "short one"])
    assert [r.n_words for r in parts] == [3, 4, 5, 2, 2]  # sentences kept whole where they fit
    with pytest.raises(ValueError, match="privatize_many"):
        split.privatize(text)
    assert fit_words([["a"] * 12], 5, "split") == [[["a"] * 5], [["a"] * 5], [["a"] * 2]]
    assert fit_words([["a"] * 3, ["b"] * 3], 5, "truncate") == [[["a"] * 3, ["b"] * 2]]


def test_a_localizer_built_before_fork_draws_new_noise_in_the_child():
    """Finding 7: a Localizer built before os.fork() (gunicorn --preload) perturbed with the same noise in
    parent and child; its own CSPRNG now re-keys from the OS at the fork (the generator itself:
    tests/common/test_rng.py)."""
    from lac_testkit import draws_across_fork

    emb = Embedding(
        "tiny", [f"w{i}" for i in range(50)], np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    )
    loc = Localizer(emb, MultivariateLaplace(0.5))  # its own CSPRNG, built before the fork
    child, parent = draws_across_fork(lambda: loc.perturb_ids(np.zeros(64, dtype=np.int64)).tobytes())
    assert len(child) == len(parent) > 0 and child != parent
