"""What an analyst learns about a release's noise and budget (issue 25), through a real curator over mutual TLS:
top()'s noise_sd/noise_low/noise_high from the record's public σ and the released pseudo-counts only (NaN where
the release states no such number), and the budget of each covered window after a previewed release."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from lac_testkit import mtls_curator_with_reports, run_lac

from lac.common import tls
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.release.posterior import LM_PRIOR_SHARE
from lac.curator.runner.uncertainty import noise_sd


@pytest.fixture
def serve(start_curator, pki, curator_public_key):
    """Factory: a curator with mutual TLS holding ``n`` sealed reports."""

    def start(n: int = 200, **overrides):
        return mtls_curator_with_reports(start_curator, pki, curator_public_key, n, **overrides)

    return start


def _client(cur, pki):
    from lac.analyst import CuratorClient

    cert, key = pki.pem("analyst")
    return CuratorClient(cur.address, ca=pki.ca, cert=cert, key=key)


def _scaled_orders(cur, items, pseudo) -> set[int]:
    """The orders whose pseudo-counts the release scaled up to the public prior's strength (public data)."""
    vocab = cur.curator.vocab
    orders = np.array([it.count(" ") + 1 for it in items])
    public = np.arange(len(items)) < len(vocab)
    return {
        n
        for n in set(orders.tolist())
        if math.isclose(
            pseudo[public & (orders == n)].sum(), LM_PRIOR_SHARE * vocab.alpha[vocab.orders == n].sum(), rel_tol=1e-9
        )
    }


def test_top_states_the_noise_of_each_ngram_from_public_numbers(serve, pki):
    """noise_sd = σ · probability / pseudo-count: the record's σ on the probability's scale, from what GetRelease
    gives the analyst; NaN exactly for orders scaled up to the prior's strength; the band is probability ∓ 1.96 sd."""
    cur = serve(n=400, clean_estimate=False, budget_epsilon=100.0)
    with _client(cur, pki) as c:
        info = c.release(epsilon=50.0, force=True)
        top = c.top(info.release_id, k=10**6)
        bigrams = c.top(info.release_id, k=10**6, order=2)
        with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
            got = curator_pb2_grpc.CuratorStub(ch).GetRelease(
                curator_pb2.GetReleaseRequest(release_id=info.release_id), timeout=30
            )
    assert list(top.columns) == ["ngram", "order", "probability", "noise_sd", "noise_low", "noise_high"]
    assert info.sigma > 0 and got.record.sigma == info.sigma  # public: the analyst's own record has it
    pseudo = dict(zip(got.items, got.pseudo_counts, strict=True))
    scaled = _scaled_orders(cur, list(got.items), np.array(got.pseudo_counts))
    assert scaled != {1, 2, 3}, "every order scaled: the test needs more reports"
    for frame in (top, bigrams):
        for row in frame.itertuples():
            if row.order in scaled:
                assert math.isnan(row.noise_sd), row
            else:
                assert row.noise_sd == pytest.approx(info.sigma * row.probability / pseudo[row.ngram], rel=1e-9)
                assert row.noise_low == pytest.approx(max(row.probability - 1.96 * row.noise_sd, 0.0))
                assert row.noise_high == pytest.approx(row.probability + 1.96 * row.noise_sd)
    finite = top[np.isfinite(top["noise_sd"])]
    assert len(finite) > 0 and (finite["noise_sd"] > 0).all()
    # Within an order the same noise is a larger share of each (renormalised, so larger) probability.
    both = bigrams.merge(top, on="ngram", suffixes=("_order", "_joint"))
    ratio = both["noise_sd_order"] / both["noise_sd_joint"]
    assert np.allclose(ratio.dropna(), (both["probability_order"] / both["probability_joint"])[ratio.notna()])


@pytest.mark.slow
def test_no_noise_is_stated_where_the_release_states_none(serve, pki):
    """A Laplace release (no pseudo-counts, no Gaussian σ) and a channel-aware clean estimate (deconvolution)
    give NaN, and the wire leaves noise_sd unset."""
    cur = serve(n=400, clean_estimate=False, budget_epsilon=100.0)
    with _client(cur, pki) as c:
        lap = c.release(epsilon=5.0, mechanism="laplace", force=True)
        top = c.top(lap.release_id, k=50)
        assert top["noise_sd"].isna().all() and top["noise_low"].isna().all()
        rid = c.release(epsilon=50.0, force=True).release_id
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        reply = curator_pb2_grpc.CuratorStub(ch).TopNgrams(
            curator_pb2.TopNgramsRequest(release_id=lap.release_id, k=5), timeout=10
        )
    assert not any(g.HasField("noise_sd") for g in reply.ngrams)
    record, items, _, pseudo = cur.call(cur.curator.get_release(rid))
    assert np.isfinite(noise_sd(record, items, pseudo, cur.curator.vocab)).any()
    channel = dataclasses.replace(record, channel="glove-6b-50d/50000 ε=8")
    assert np.isnan(noise_sd(channel, items, pseudo, cur.curator.vocab)).all()
    # Four reports: the users' mass is below a quarter of the prior's, so every order was scaled up to it.
    few = serve(n=4, clean_estimate=False, budget_epsilon=100.0)
    with _client(few, pki) as c:
        rid = c.release(epsilon=50.0, force=True).release_id
        top = c.top(rid, k=50)
    _, items, _, pseudo = few.call(few.curator.get_release(rid))
    assert _scaled_orders(few, list(items), pseudo) == {1, 2, 3}
    assert top["noise_sd"].isna().all()


@pytest.mark.slow
def test_preview_gives_the_budget_after_the_release(serve, pki, capsys):
    """Each covered window's spent and remaining (ε, δ) after the release, from the ledger GetBudget shows plus
    the release's charge, including a DP count the accuracy check would take first; an overspend says so."""
    from lac.analyst import WindowBudget

    cur = serve(n=40, budget_epsilon=10.0, budget_delta=1e-5, min_signal_share=0.25, count_epsilon=2.0)
    with _client(cur, pki) as c:
        (window,) = c.budget()["window"]
        first = c.preview(epsilon=1.0, delta=1e-6)  # no DP count held yet: the release would take one (ε = 2)
        assert first.budget_after == (WindowBudget(int(window), 3.0, 1e-6, 7.0, 9e-6),)
        assert f"Budget after it: window {window} keeps ε 7 of 10 and δ 9e-06 of 1e-05." in first.statement
        c.release(epsilon=1.0, delta=1e-6, force=True)  # forced: no accuracy check, no count
        spent = c.budget().iloc[0]
        second = c.preview(epsilon=2.0, delta=1e-6, force=True)
        (after,) = second.budget_after
        assert after.spent_epsilon == pytest.approx(spent["spent_epsilon"] + 2.0)
        assert after.remaining_epsilon == pytest.approx(spent["remaining_epsilon"] - 2.0)
        assert after.remaining_delta == pytest.approx(spent["remaining_delta"] - 1e-6)
        over = c.preview(epsilon=9.5, force=True)
        assert over.budget_after[0].remaining_epsilon < 0
        assert f"It would overspend window {window}: ε 10.5 of 10" in over.statement
        assert c.budget().iloc[0]["spent_epsilon"] == spent["spent_epsilon"]  # previews spend nothing
    cert, key = pki.pem("analyst")
    flags = ["--server", cur.address, "--ca", pki.ca, "--cert", cert, "--key", key]
    code, out, _ = run_lac(capsys, "curator", "release", *flags, "--epsilon", "2", "--force", "--dry-run")
    assert code == 0 and "Budget after it: window" in out and "keeps ε 7 of 10" in out
    code, out, _ = run_lac(capsys, "curator", "release", *flags, "--epsilon", "2", "--force", "--dry-run", "--json")
    (row,) = json.loads(out)["budget_after"]
    assert row["window"] == window and row["spent_epsilon"] == pytest.approx(3.0)
