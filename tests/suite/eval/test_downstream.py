"""A classifier trained on privatized text, tested on clean text (lac.suite.eval.downstream): the library
function, the export path (sealed reports -> a real curator -> ExportReports -> training) and the section."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from lac.common.cli import main
from lac.suite.eval import authorship, downstream
from lac.suite.eval.config import PRESETS

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def split():
    s, info = downstream.downstream_data(TINY, np.random.default_rng(3))
    return s, info


def test_data_from_packages(split):
    s, info = split
    assert len(s.train_texts) == TINY.downstream_train * len(TINY.downstream_topics)
    assert len(s.test_texts) == TINY.downstream_test * len(TINY.downstream_topics)
    assert all(len(t.split()) == TINY.downstream_words for t in s.train_texts + s.test_texts)
    assert not set(s.train_texts) & set(s.test_texts)
    assert info["definitions"] > 100_000 and {t["topic"] for t in info["topics"]} == set(TINY.downstream_topics)


def test_evaluate_trains_on_privatized_and_tests_on_clean(split):
    s, _ = split
    factory = authorship.default_localizer_factory(5_000, np.random.default_rng(1))
    res = downstream.evaluate(s, factory, epsilons=(25.0,), rng=np.random.default_rng(2))
    assert res["chance"] == pytest.approx(1 / len(TINY.downstream_topics))
    assert [(r["epsilon"], r["preset"]) for r in res["rows"]] == [
        (5.0, "private"),
        (8.0, "balanced"),
        (10.0, "utility"),
        (25.0, None),
    ]
    assert res["clean"]["ci_low"] > res["chance"]  # the clean model learns the topics
    kept = [r["words_kept"] for r in res["rows"]]
    assert kept == sorted(kept) and 0 < kept[0] < kept[-1] < 1  # more ε, more words kept
    for r in res["rows"]:
        assert 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1 and r["n"] == len(s.test_texts)
    json.dumps(res)
    with pytest.raises(ValueError, match="two classes"):
        downstream.evaluate(authorship.LabelledSplit(["a b"], ["x"], ["a"], ["x"]), factory)


def test_the_export_path_returns_exactly_the_privatized_reports_per_collection(tmp_path):
    """Sealed to a real curator, one closed window per label, exported over gRPC: the rows of each window are
    the reports sent for it (shuffled), the guarantee is the local one, the ledger lists each export."""
    factory = authorship.default_localizer_factory(5_000, np.random.default_rng(4))
    loc = factory(8.0)
    texts = {"a": ["the dog sleeps in the sun"] * 6, "b": ["we walk in the park every day", "a small red star"]}
    reports = {k: loc.privatize_many(v) for k, v in texts.items()}
    got, ledger = downstream.export_round_trip(reports, loc, tmp_path)
    for k, rs in reports.items():
        assert Counter(got[k]) == Counter(r.text for r in rs)
    assert ledger["exports"] == 2 and ledger["rows"] == 8
    assert "local differential privacy only" in ledger["statement"] and "ε = 8 per unit" in ledger["statement"]


@pytest.mark.slow
def test_tiny_section_runs_and_writes_its_figure(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--preset", "tiny", "--only", "downstream", "--out", str(tmp_path)])
    assert e.value.code == 0
    blob = (tmp_path / "downstream.png").read_bytes()
    assert blob.startswith(b"\x89PNG") and len(blob) > 20_000
    res = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["downstream"]
    assert [r["epsilon"] for r in res["rows"]] == [3.0, 5.0, 8.0, 10.0, 25.0]
    e = res["export"]
    assert e["preset"] == "balanced" and e["rows"] == res["train"] and e["exports"] == len(TINY.downstream_topics)
    assert e["ci_low"] > res["chance"]  # trained on exported privatized reports, it still beats chance
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## 9. A classifier trained on privatized text, tested on clean text" in report
    assert "](downstream.png)" in report and "through the export path" in report and "wordnet-base" in report
    assert "NOT a central differential-privacy release" in report
