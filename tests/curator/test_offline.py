import json

import numpy as np
import pytest
import scipy.sparse as sp
from lac_testkit import run_lac

from lac.common.privacy import PrivacyUnit
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.runner.offline import (
    ReleaseRefused,
    default_out_path,
    default_vocab_path,
    load_public,
    release_offline,
)

ITEMS = ("the", "cat", "sat", "the cat", "cat sat", "on", "mat", "the mat")


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    n, V = 60, len(ITEMS)
    dense = np.zeros((n, V), dtype=np.int64)
    for u in range(n):
        dense[u, rng.choice(V, size=int(rng.integers(1, 4)), replace=False)] = rng.integers(1, 3)
    counts = tmp_path / "users.npz"
    sp.save_npz(counts, sp.csr_matrix(dense))
    default_vocab_path(counts).write_text("\n".join(ITEMS) + "\n", encoding="utf-8")
    public = tmp_path / "public.tsv"
    public.write_text(
        "# public counts\nthe\t100\ncat\t20\nsat\t5\nthe cat\t10\nmat\t7\nnot in vocab\t3\n", encoding="utf-8"
    )
    return counts, public, dense


@pytest.fixture
def cli(capsys):
    """``lac curator release ARGS`` in-process: its stdout (the command must succeed)."""

    def run(*args: str) -> str:
        code, out, err = run_lac(capsys, "curator", "release", *args)
        assert code == 0, err
        return out

    return run


def test_load_public_formats(tmp_path, files):
    _, public, _ = files
    a = load_public(public, ITEMS)
    np.testing.assert_array_equal(a, [100, 20, 5, 10, 0, 0, 7, 0])
    v = NgramVocabulary(("cat", "the", "mat"), np.array([2.0, 9.0, 1.0]), 2)
    v.save(tmp_path / "pub.npz")
    np.testing.assert_array_equal(load_public(tmp_path / "pub.npz", ITEMS), [9, 2, 0, 0, 0, 0, 1, 0])
    bad = tmp_path / "bad.tsv"
    bad.write_text("the 100\n", encoding="utf-8")
    with pytest.raises(ValueError):
        load_public(bad, ITEMS)
    bad.write_text("the\t1\nthe\t2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate"):
        load_public(bad, ITEMS)


def test_release_offline_library(files, tmp_path):
    counts, public, _ = files
    rec = release_offline(
        counts,
        public,
        ReleaseSpec(epsilon=1.0, force=True),  # 60 reports: the accuracy check would refuse it
        PublicCaps(W=3, count_clip=100),
        rng=np.random.default_rng(1),
    )
    assert rec["data_dependent"] is False and "Gaussian posterior" in rec["statement"]
    assert rec["out"] == str(default_out_path(counts, "posterior"))
    with np.load(rec["out"]) as z:
        lp = z["log_probs"]
        assert json.loads(z["record"].tobytes().decode()) == rec
        assert z["items"].tobytes().decode().split("\n") == list(ITEMS)
        pseudo = z["pseudo_counts"]
        sd = z["error_sd"]  # its error bars, as the curator stores them
    assert rec["error_bars"]["method"] == "bootstrap" and sd.shape == lp.shape and np.isfinite(sd).all()
    assert rec["statement"].endswith(rec["error_bars"]["statement"])
    assert np.isclose(np.exp(lp).sum(), 1.0)
    np.testing.assert_allclose(pseudo / pseudo.sum(), np.exp(lp), rtol=1e-9)
    with pytest.raises(ValueError, match="vocabulary"):
        release_offline(counts, public, ReleaseSpec(epsilon=1.0), PublicCaps(), vocab=public)


@pytest.mark.parametrize(
    "mechanism,extra",
    [
        ("bayesian", []),
        ("bayesian", ["--sensitivity", "bruteforce"]),
        ("bayesian", ["--max-items-per-report", "3", "--count-clip", "1000", "--reports-per-user", "2"]),
        ("endtoend", []),
        ("laplace", ["--max-items-per-report", "3"]),
        ("laplace-public", ["--max-items-per-report", "3"]),
        ("kanon", ["--k-anonymity", "5"]),
    ],
)
def test_cli_json(files, tmp_path, cli, mechanism, extra):
    counts, public, dense = files
    out = tmp_path / f"{mechanism}.npz"
    rec = json.loads(
        cli(
            "--counts",
            str(counts),
            "--public",
            str(public),
            "--mechanism",
            mechanism,
            "--epsilon",
            "1.5",
            "--delta",
            "1e-6",
            "--out",
            str(out),
            "--json",
            "--force",  # 60 reports: the accuracy check would refuse most of these
            *extra,
        )
    )
    for key in (
        "mechanism",
        "params",
        "sensitivity_method",
        "gamma",
        "sigma",
        "epsilon",
        "delta",
        "n_users",
        "vocab_size",
        "data_dependent",
        "statement",
        "out",
    ):
        assert key in rec
    assert rec["mechanism"] == mechanism
    assert rec["n_users"] == dense.shape[0] and rec["vocab_size"] == len(ITEMS)
    assert rec["out"] == str(out) and out.exists()
    with np.load(out) as z:
        assert np.isclose(np.exp(z["log_probs"]).sum(), 1.0)
    if mechanism in ("bayesian", "endtoend"):
        assert rec["epsilon"] == pytest.approx(1.5) and rec["delta"] == 1e-6
        assert rec["gamma"] > 0 and rec["sigma"] > 0
    if mechanism == "kanon" or "bruteforce" in extra:
        assert rec["statement"].startswith("NOT differentially private") and not rec["differentially_private"]
    if "--reports-per-user" in extra:
        assert "one user's reports (at most 2)" in rec["statement"]
    if mechanism == "endtoend":
        assert rec["params"]["epsilon_select"] + rec["params"]["epsilon_release"] == pytest.approx(1.5)


def test_cli_default_out_and_text(files, cli):
    counts, public, _ = files
    text = cli("--counts", str(counts), "--public", str(public), "--epsilon", "1", "--delta", "1e-6", "--force")
    assert str(default_out_path(counts, "posterior")) in text
    assert default_out_path(counts, "posterior").exists()


def test_cli_without_counts_still_uses_server(capsys, monkeypatch):
    """No --counts: the RPC path is taken (fails fast to connect to a closed port)."""
    import functools

    from lac.analyst import client as analyst

    waits: list[float] = []  # the retries' back-off, recorded instead of slept
    monkeypatch.setattr(
        analyst, "release_with_retries", functools.partial(analyst.release_with_retries, sleep=waits.append)
    )
    code, _, err = run_lac(
        capsys, "curator", "release", "--server", "127.0.0.1:1", "--insecure", "--epsilon", "1", "--delta", "1e-6"
    )
    assert code != 0 and waits  # UNAVAILABLE is retried
    assert "UNAVAILABLE" in err or "failed to connect" in err.lower() or "unavailable" in err.lower()


def test_offline_posterior_runs_without_discovery_and_says_so(files, tmp_path, cli):
    """A counts matrix holds no n-gram outside the vocabulary: no δ/2 goes to discovery, and the
    statement and record say what was spent (all of (ε, δ) on the Gaussian counts)."""
    from lac.curator.release.posterior import PosteriorParams

    counts, public, _ = files
    rec = release_offline(counts, public, ReleaseSpec(epsilon=1.0, force=True), PublicCaps(W=3), out=tmp_path / "a.npz")
    assert rec["spec"]["discovery"] is False and rec["params"]["discovery"] == 0.0
    assert rec["sigma"] == PosteriorParams(1.0, 1e-6, W=3, discovery=False).sigma
    assert rec["sigma"] < PosteriorParams(1.0, 1e-6, W=3, discovery=True).sigma
    assert "analytic calibration for (ε, δ) = (1, 1e-06)" in rec["statement"]
    assert "δ_s" not in rec["statement"] and "every other n-gram seen" not in rec["statement"]
    args = (
        "--counts",
        str(counts),
        "--public",
        str(public),
        "--epsilon",
        "1",
        "--max-items-per-report",
        "3",
        "--json",
        "--force",
    )
    plain = json.loads(cli(*args, "--out", str(tmp_path / "b.npz")))
    flagged = json.loads(cli(*args, "--no-discovery", "--out", str(tmp_path / "c.npz")))
    for r in (plain, flagged):
        assert r["spec"]["discovery"] is False and r["sigma"] == rec["sigma"]
        guarantee, bars = r["statement"].split(" Error bars: ")  # the bootstrap's seed differs between releases
        assert rec["statement"].startswith(guarantee + " Error bars: ") and bars.startswith("each n-gram's")


def test_offline_accuracy_check_refuses_a_swamped_release_unless_forced(files, tmp_path, capsys, cli):
    """The curator's accuracy check, with its message, before an offline release; --force releases anyway."""
    from lac.curator.runner.preview import predict, refusal

    counts, public, _ = files
    out = tmp_path / "r.npz"
    args = ("--counts", str(counts), "--public", str(public), "--epsilon", "0.001", "--out", str(out))
    code, _, err = run_lac(capsys, "curator", "release", *args)
    vocab = NgramVocabulary(ITEMS, load_public(public, ITEMS), 2)
    want = predict(
        ReleaseSpec(0.001, discovery=False),
        vocab,
        PublicCaps(W=100, C=3),
        PrivacyUnit.user(1),
        reports=60,
        reports_source="the rows of the counts, exact",
        target_share=0.25,
    )
    assert want.swamped
    assert code == 2 and err.strip() == f"lac curator release: {refusal(want, 'nothing was spent')}"
    assert "the noise would swamp the signal" in err and "--force" in err and not out.exists()
    assert cli(*args, "--dry-run").strip() == f"dry run (nothing released): {want.statement()}" and not out.exists()
    rec = json.loads(cli(*args, "--force", "--json"))
    assert out.exists() and rec["preview"] == want.statement()
    # an assumed number of reports is the one the check uses, as on the server
    assert "1,000,000,000 reports (assumed by the request)" in cli(
        *args, "--expected-reports", "1000000000", "--dry-run"
    )
    with pytest.raises(ReleaseRefused, match="^release refused: "):
        release_offline(counts, public, ReleaseSpec(epsilon=0.001), PublicCaps(), out=out)
    release_offline(counts, public, ReleaseSpec(epsilon=0.001), PublicCaps(), out=out, min_signal_share=0)  # no check
    kanon = release_offline(counts, public, ReleaseSpec(epsilon=1, mechanism="kanon", K=2), PublicCaps(), out=out)
    assert kanon["preview"] is None  # not DP, nothing to predict: never refused


def test_caps_and_expected_reports_are_whole_numbers():
    """``PublicCaps`` and ``ReleaseSpec.expected_reports`` are checked by ``check_int`` (numpy integers read as int)."""
    caps = PublicCaps(W=np.int64(3))
    assert caps.W == 3 and type(caps.W) is int
    assert type(ReleaseSpec(epsilon=1.0, expected_reports=np.int32(5)).expected_reports) is int
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="^C must be an integer >= 1"):
            PublicCaps(C=bad)
        with pytest.raises(ValueError, match="^expected_reports must be an integer >= 1"):
            ReleaseSpec(epsilon=1.0, expected_reports=bad)
