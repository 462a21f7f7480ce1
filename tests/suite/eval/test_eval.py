"""`lac eval`: a tiny configuration end to end (real corpora and embedding), plus its statistics helpers."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from lac.common.cli import main
from lac.suite.eval.metrics import clopper_pearson, epsilon_lower_bound, kl, smooth
from lac.suite.eval.report import summary as main_summary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "fig1_kl_vs_epsilon.png",
    "fig2_kl_vs_users.png",
    "fig3_kl_vs_vocab.png",
    "fig4_kl_vs_public_noise.png",
    "fig5_kanon.png",
    "fig6_membership.png",
    "localizer_tradeoff.png",
    "pipeline_end_to_end.png",
    "e2e_frontier.png",
)
SECTIONS = (
    "## Data",
    "## 1. The LAC default, BayesianDP and baselines",
    "## 2. Language modelling",
    "## 3. Membership inference",
    "## 4. Localizer trade-off",
    "## 5. End to end",
    "## 6. Targets",
    "## 7. End to end: through the device",
    "## Reproducibility",
)


def _png_size(blob: bytes) -> tuple[int, int]:
    assert blob[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", blob[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", blob[16:24])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    with pytest.raises(SystemExit) as e:
        main(["eval", "--preset", "tiny", "--out", str(out)])
    assert e.value.code == 0
    return out


def test_tiny_run_writes_plots_report_and_results(tiny_run):
    out = tiny_run
    for name in FIGURES:
        blob = (out / name).read_bytes()
        w, h = _png_size(blob)
        assert w >= 400 and h >= 300, name
        assert len(blob) > 10_000, f"{name} is suspiciously small"
        assert blob.endswith(b"IEND\xaeB`\x82"), f"{name} is truncated"
    report = (out / "report.md").read_text(encoding="utf-8")
    for heading in SECTIONS:
        assert heading in report, heading
    for name in FIGURES:
        assert f"]({name})" in report, f"report does not show {name}"
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    d = res["data"]
    for key in ("public_words", "train_users", "heldout_users", "vocab_size", "train_items_raw"):
        assert d[key] > 0
        assert f"{d[key]:,}" in report, f"data size {key} missing from the report"
    # Honest labelling.
    assert "NOT differentially private" in report
    assert "data-dependent" in report
    assert "no amplification" in report.lower()
    # Table 1 has the paper's rows with the paper's numbers beside them, and finite perplexities.
    rows = {r["mechanism"]: r for r in res["table1"]["rows"]}
    for name, paper in (("private", 29.48), ("kanon", 35.51), ("bayes", 35.55), ("laplace", 894.32), ("public", 43.0)):
        assert rows[name]["paper"] == paper
        assert math.isfinite(rows[name]["perplexity"]["median"]) and rows[name]["perplexity"]["median"] > 1
    # The membership check ran for every (mechanism, ε) and the sound modes hold.
    mi = res["membership"]
    assert len(mi["rows"]) == 4 * len(res["config"]["mi_epsilons"])
    assert mi["sound_never_exceeded"] is True
    # The audit can fail and says where it cannot decide: with the tiny preset's 40 pairs per ε it
    # certifies ε = 1 (38 pairs needed) and is inconclusive at ε = 20 (finding 8: it used to say PASS).
    assert mi["check"] == "PASS" and mi["inconclusive_from"] == 20.0
    assert "INCONCLUSIVE for ε ≥ 20" in report
    # The sound default is in every KL figure, Table 1 and the audit; the targets section states each target.
    assert rows["posterior"]["privacy"].startswith("sound") and math.isfinite(rows["posterior"]["perplexity"]["median"])
    assert "posterior" in {r["mechanism"] for r in mi["rows"]}
    assert all("posterior" in res["figures"][f]["rows"][0] for f in ("fig1", "fig2", "fig3", "fig4"))
    tg = res["targets"]
    assert [c["target"] for c in tg["checks"]] == ["beats-public", "near-private", "kl-cut"]
    assert tg["checks"][0]["met"] is None and "not measured" in report  # the tiny preset has no 50k point
    assert "Target: " in main_summary(res)
    for fig in ("fig1", "fig2", "fig3", "fig4"):
        for row in res["figures"][fig]["rows"]:
            for k, v in row.items():
                if isinstance(v, dict):
                    assert v["runs"] == res["config"]["runs"] and 0 <= v["min"] <= v["median"] <= v["max"]


def test_kl_and_smoothing():
    p = np.array([0.5, 0.5, 0.0])
    assert kl(p, p, 0.0) == pytest.approx(0.0)
    q = np.array([1.0, 0.0, 0.0])
    assert math.isfinite(kl(p, q, 1e-4)) and kl(p, q, 1e-4) > 0
    assert smooth(q, 0.3).sum() == pytest.approx(1.0)


def test_clopper_pearson_and_epsilon_bound():
    lo, hi = clopper_pearson(50, 100, 0.95)
    assert lo < 0.5 < hi
    assert clopper_pearson(100, 100, 0.95) == (pytest.approx(0.05 ** (1 / 100)), 1.0)
    assert clopper_pearson(0, 100, 0.95)[0] == 0.0
    # Chance-level success gives no bound; perfect success over n pairs is capped by n.
    assert epsilon_lower_bound(50, 100, 0.0, 0.95) == 0.0
    b100, b1000 = epsilon_lower_bound(100, 100, 0.0, 0.95), epsilon_lower_bound(1000, 1000, 0.0, 0.95)
    assert 0 < b100 < b1000 < 0.5 * math.log(1000 / 3.0) + 0.5
    # δ makes the bound weaker.
    assert epsilon_lower_bound(90, 100, 0.01, 0.95) < epsilon_lower_bound(90, 100, 0.0, 0.95)


def test_eval_is_a_lac_subcommand(capsys):
    from lac.common.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["eval", "--help"])
    assert e.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_tiny_run_measures_the_release_end_to_end_against_the_clean_text(tiny_run):
    """Section 7: the perturbed and the channel-aware releases, the public prior and the clean counts, all
    measured on the clean held-out text of both user corpora (the simulated users and FOLDOC, close to the
    public domain); KL per order and jointly over all orders, and each order's share of the mass, which the
    per-order KL cannot see; every target says what it needs or what it measured."""
    out = tiny_run
    e2e = json.loads((out / "results.json").read_text(encoding="utf-8"))["e2e"]
    assert [pt["corpus"] for pt in e2e["points"]] == ["user", "close"] and e2e["L"] == 40
    for pt in e2e["points"]:
        assert 1 < pt["clean"]["ppl"] < math.inf and 1 < pt["public"]["ppl"] < math.inf
        if pt["corpus"] == "user":  # the users' own counts model their text best (at the tiny preset's few
            # users not on FOLDOC's text, which is close to the public corpus's domain)
            assert pt["clean"]["ppl"] < pt["public"]["ppl"]
        # KL against the smoothed clean counts themselves: only the smoothing's cost
        assert 0.0 <= pt["clean"]["kl_joint"] < pt["public"]["kl_joint"] / 10
        assert sum(pt["clean"]["shares"]) == pytest.approx(1.0)
        (row,) = pt["rows"]
        assert row["preset"] == "balanced" and 0.3 < row["words_changed"] < 0.9
        for name in ("release-perturbed", "release-clean"):
            assert math.isfinite(row[name]["ppl"]["median"]) and len(row[name]["kl"]) == 3
            assert math.isfinite(row[name]["kl_joint"]) and sum(row[name]["shares"]) == pytest.approx(1.0)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "close corpus" in report and "joint KL" in report
    assert {c["text"] for c in e2e["checks"]} and all("shown" in c for c in e2e["checks"])


def test_the_evaluations_channel_is_sampled_as_a_curator_samples_it():
    from lac.curator.release.channel import CHANNEL_DRAWS
    from lac.suite.eval.config import EvalConfig

    assert EvalConfig().e2e_channel_draws == CHANNEL_DRAWS
