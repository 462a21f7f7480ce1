"""Plausible-deniability calibration: N_w, S_w, nn10 share, bands, recommendation, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lac_testkit import run_lac

from lac.client import calibrate as cal
from lac.client.localizer import Localizer
from lac.client.mechanisms import MultivariateLaplace
from lac.client.nearest import sqdist64


class _Fixed:
    """A stand-in localizer whose outputs are scripted, to check the statistics exactly."""

    def __init__(self, embedding, script):
        self.embedding, self.script = embedding, script

    def perturb_ids(self, ids):
        return self.script(np.asarray(ids))


def test_nearest_neighbours_match_brute_force(glove200):
    ids = np.array([0, 5, 17, 199])
    nb = cal.nearest_neighbours(glove200, ids)
    for i, r in enumerate(ids):
        d = sqdist64(glove200.vectors, glove200.vectors[r])
        d[r] = np.inf
        np.testing.assert_array_equal(nb[i], np.lexsort((np.arange(d.size), d))[:10])


def test_word_stats_exact_on_scripted_outputs(glove200):
    nb = cal.nearest_neighbours(glove200, np.array([3, 4]))

    def script(ids):
        out = ids.copy().reshape(2, 10)
        out[0, :4] = nb[0, 0]  # word 3: 6 unchanged, 4 to its nearest neighbour
        out[1, :] = np.arange(100, 110)  # word 4: 10 distinct far words
        return out.ravel()

    st = cal.word_stats(_Fixed(glove200, script), [3, 4], draws=10, neighbours=nb)
    np.testing.assert_allclose(st.n_w, [0.6, 0.0])
    np.testing.assert_array_equal(st.s_w, [2, 10])
    assert st.nn10[0] == pytest.approx(0.4)
    assert st.nn10[1] == pytest.approx(np.isin(np.arange(100, 110), nb[1]).mean())


def test_bands_and_choice(glove10k):
    assert cal.default_bands(10_000) == [(0, 100), (100, 1000), (1000, 10000)]
    assert cal.default_bands(50) == [(0, 50)]
    ids, which = cal.choose_words(glove10k, 7, np.random.default_rng(0))
    assert ids.size == 21 and np.all(np.bincount(which) == 7)
    for b, (lo, hi) in enumerate(cal.default_bands(10_000)):
        sel = ids[which == b]
        assert np.all((sel >= lo) & (sel < hi)) and np.unique(sel).size == 7


def test_n_w_monotone_in_epsilon_and_recommend(glove10k):
    ids, which = cal.choose_words(glove10k, 8, np.random.default_rng(1))
    bands = cal.default_bands(glove10k.size)
    rows = cal.calibrate(
        glove10k,
        MultivariateLaplace,
        [3, 10, 30],
        ids,
        40,
        np.random.default_rng(2),
        bands=bands,
        band_of=which,
        progress=False,
    )
    med = [r.median_n_w for r in rows]
    assert med[0] < med[1] < med[2] and med[2] > 0.9
    assert rows[0].median_s_w > rows[2].median_s_w
    assert set(rows[0].bands) == {"0-100", "100-1000", "1000-10000"}
    assert cal.recommend(rows, target=med[1]) == 10
    assert cal.recommend(rows, target=-1) is None
    doc = json.loads(
        cal.to_json(
            rows, embedding=glove10k, mechanism="laplace", draws=40, target=0.5, recommended=cal.recommend(rows)
        )
    )
    assert [r["epsilon"] for r in doc["rows"]] == [3, 10, 30]
    assert "median_n_w" in doc["rows"][0]["bands"]["0-100"]
    assert cal.format_table(rows, 40).count("\n") == 3


def test_n_w_estimate_matches_direct_count(glove200):
    loc = Localizer(glove200, MultivariateLaplace(6.0), np.random.default_rng(3))
    st = cal.word_stats(loc, [10], draws=4000)
    # Same mechanism, independent draws: agree within 5 binomial standard errors.
    loc2 = Localizer(glove200, MultivariateLaplace(6.0), np.random.default_rng(4))
    p = (loc2.perturb_ids(np.full(4000, 10)) == 10).mean()
    se = np.sqrt(2 * p * (1 - p) / 4000) + 1e-9
    assert abs(st.n_w[0] - p) < 5 * se


def test_parse_floats():
    assert cal.parse_floats("5, 10,15") == [5, 10, 15]
    for bad in ("", "0", "-1", "nan", "x"):
        with pytest.raises(ValueError):
            cal.parse_floats(bad)


def test_cli_json(data_dir, capsys):
    # A tiny vocabulary built from the installed wheel into the session's private embedding cache.
    code, out, err = run_lac(
        capsys,
        "client",
        "calibrate",
        "--words",
        "the,king",
        "--epsilons",
        "5,30",
        "--draws",
        "20",
        "--vocab-size",
        "2000",
        "--json",
        "--seed",
        "1",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["embedding"] == "glove-6b-50d/2000" and set(doc["rows"][0]["words"]) == {"the", "king"}
    assert doc["rows"][1]["words"]["king"]["n_w"] >= doc["rows"][0]["words"]["king"]["n_w"]
    code, _, err = run_lac(capsys, "client", "calibrate", "--words", "zqxvort", "--vocab-size", "2000")
    assert code == 2 and "zqxvort" in err
    assert doc["embedding_size"] == 2000 and doc["embedding_dim"] == 50 and doc["embedding_diameter"] > 0


@pytest.mark.parametrize("mechanism", ["laplace", "truncated"])
def test_cli_privatize_json_metadata(data_dir, tmp_path, capsys, mechanism):
    src = tmp_path / "in.txt"
    src.write_text("the king spoke to the zqxvort\n\nhello world\n", encoding="utf-8")
    code, out, err = run_lac(
        capsys,
        "client",
        "privatize",
        str(src),
        "--json",
        "--vocab-size",
        "2000",
        "--epsilon",
        "10",
        "--mechanism",
        mechanism,
    )
    assert code == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["n_words"] for d in docs] == [6, 2]
    md = docs[0]["metadata"]
    assert md["embedding"]["size"] == 2000 and md["embedding"]["dim"] == 50
    assert "ℓ·ε = 60" in md["report_composition"] and "Earth Mover" in md["bag_earth_movers"]
    assert "zqxvort" not in out
    assert "2000 words, d=50, diameter" in err  # the embedding is described on stderr
    if mechanism == "truncated":
        assert "τ" in md["metric"]
