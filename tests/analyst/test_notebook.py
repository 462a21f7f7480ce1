"""Notebook output (``lac.analyst.notebook``): the HTML of releases, previews and budgets is well formed and
escaped and carries the guarantee statement; the top n-grams (with their noise intervals) and the budget per
window plot with matplotlib's Agg backend, from a real curator over mutual TLS."""

from __future__ import annotations

import math
from html.parser import HTMLParser

import matplotlib
import pandas as pd
import pytest
from lac_testkit import mtls_curator_with_reports

from lac.analyst.client import Budget, CuratorClient, ReleaseInfo, ReleasePreview, WindowBudget
from lac.analyst.notebook import plot_top
from lac.common.v1 import curator_pb2

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.pyplot as plt

EVIL = '<script>alert("x")</script> & <b>'
VOID = {"br", "hr", "img", "meta", "input", "link"}


class _Checked(HTMLParser):
    """Collects the text and the tags of a fragment; fails on a tag closed out of order or left open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parsed(fragment: str) -> _Checked:
    checked = _Checked()
    checked.feed(fragment)
    checked.close()
    assert checked.stack == [], f"left open: {checked.stack}"
    return checked


def _record(**fields) -> ReleaseInfo:
    r = curator_pb2.ReleaseRecord(
        release_id="r-1",
        mechanism="posterior",
        epsilon=1.0,
        delta=1e-6,
        differentially_private=True,
        first_window=3,
        last_window=4,
        privacy_unit="one client over an accounting window",
        statement="(1, 1e-06)-DP for each client " + EVIL,
        sigma=2.5,
        vocab_size=1234,
        max_n=3,
    )
    for k, v in fields.items():
        setattr(r, k, v)
    return ReleaseInfo.from_proto(r)


def test_release_html_is_well_formed_escaped_and_states_the_guarantee():
    for record in (_record(), _record(differentially_private=False, mechanism=EVIL)):
        page = record._repr_html_()
        checked = _parsed(page)
        assert "script" not in checked.tags and "b" not in checked.tags  # the evil text stayed text
        text = "".join(checked.text)
        assert record.statement in text and "r-1" in text and "(1, 1e-06)" in text
        assert ("NOT DIFFERENTIALLY PRIVATE" in text) != record.differentially_private
        assert "&lt;script&gt;" in page


def test_preview_and_budget_html_are_well_formed_escaped_and_state_the_guarantee():
    windows = (WindowBudget(3, 1.0, 1e-6, 9.0, 9e-6), WindowBudget(4, 11.0, 1e-6, -1.0, 9e-6))
    preview = ReleasePreview(
        mechanism="posterior",
        epsilon=1.0,
        delta=1e-6,
        noise=3.5,
        noise_unit="σ of a count",
        reports=None,
        reports_source="",
        resolvable=(),
        signal_share=None,
        swamped=None,
        target_share=0.5,
        reports_needed=20_000,
        epsilon_needed=None,
        advice="wait for more reports " + EVIL,
        statement="the release would be (1, 1e-06)-DP " + EVIL,
        budget_after=windows,
    )
    budget = Budget(windows, 10.0, 1e-5, 86400.0, 1)
    for obj in (preview, budget):
        page = obj._repr_html_()
        checked = _parsed(page)
        assert "script" not in checked.tags and "table" in checked.tags
        text = "".join(checked.text)
        assert obj.statement in text and "-1" in text  # an overspent window shows as such
    assert "wait for more reports" in preview._repr_html_()
    assert "(ε, δ) = (10, 1e-05)" in budget.statement and "basic composition" in budget.statement


def test_plot_top_draws_bars_with_intervals_where_stated():
    """Each stated interval is drawn from noise_low to noise_high as it is (also one that does not contain the
    released probability, as Laplace's can), labelled with the table's level; rows without one get none."""
    table = {
        "ngram": ["the", "of the", "a", EVIL],
        "probability": [0.05, 0.01, 0.001, 0.002],
        "noise_low": [0.04, 0.0, 0.003, math.nan],
        "noise_high": [0.06, 0.02, 0.009, math.nan],
    }
    frame = pd.DataFrame(table)
    frame.attrs["lac.error_bars"] = {"level": 0.8, "statement": "Error bars: ..."}
    ax = plot_top(frame, _record())
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.get_yticklabels()] == table["ngram"]
    (bars,) = ax.collections
    assert len(ax.patches) == 4 and [seg[:, 0].tolist() for seg in bars.get_segments()] == [
        [0.04, 0.06],
        [0.0, 0.02],
        [0.003, 0.009],  # above the released 0.001: drawn where it is
    ]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["80% interval due to the DP noise"]
    assert "release r-1" in ax.get_title()
    plt.close(ax.figure)
    none = plot_top(pd.DataFrame({k: v[3:] for k, v in table.items()}))
    assert not none.collections and "no error bars for these n-grams" in none.get_title()
    plt.close(none.figure)


def test_a_real_release_and_budget_plot_and_show_as_html(start_curator, pki, curator_public_key):
    cur = mtls_curator_with_reports(start_curator, pki, curator_public_key, 23, budget_epsilon=100.0)
    cert, key = pki.pem("analyst")
    with CuratorClient(cur.address, ca=pki.ca, cert=cert, key=key) as client:
        release = client.release(5.0, force=True)
        fig, (left, right) = plt.subplots(1, 2)
        assert release.plot_top(k=5, ax=left) is left
        assert len(left.patches) == 5 and len(left.collections[0].get_segments()) == 5  # an error bar on each
        assert [t.get_text() for t in left.get_legend().get_texts()] == ["90% interval due to the DP noise"]
        budget = client.budget_summary()
        assert budget.plot(ax=right) is right
        fig.canvas.draw()
        assert [w.window for w in budget.windows] == [release.first_window]
        assert budget.windows[0].spent_epsilon == pytest.approx(release.ledger_epsilon)
        assert release.statement in "".join(_parsed(release._repr_html_()).text)
        assert budget.statement in "".join(_parsed(budget._repr_html_()).text)
        preview = client.preview(1.0)
        assert preview.statement in "".join(_parsed(preview._repr_html_()).text)
        same = client.release_info(release.release_id)
        assert same == release and same.plot_top(k=3).figure is not None
    plt.close("all")
    import pickle

    assert pickle.loads(pickle.dumps(release)) == release  # the client it came from is not pickled
    with pytest.raises(ValueError, match="pass client="):
        _record().plot_top()
