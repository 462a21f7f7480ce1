"""What an analyst learns about a release's noise and budget (issues 25 and 33), through a real curator over mutual
TLS: every release of every DP mechanism carries finite error bars on every n-gram it lists (top()'s noise_sd,
noise_low, noise_high, at the level asked for), computed when it was made and stored with it; a release that is not
DP, or one stored before releases had error bars, has none and says so; and the budget of each covered window after
a previewed release."""

from __future__ import annotations

import dataclasses
import json
import math

import grpc
import numpy as np
import pytest
from lac_testkit import mtls_curator_with_reports, run_lac

from lac.common import tls
from lac.common.privacy import Budget
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator import mechanisms
from lac.curator.service.handlers import release


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


def _stub_call(cur, pki, method: str, request):
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        return getattr(curator_pb2_grpc.CuratorStub(ch), method)(request, timeout=30)


def _finite_bars(frame) -> bool:
    sd, low, high, p = (frame[c].to_numpy() for c in ("noise_sd", "noise_low", "noise_high", "probability"))
    return bool(
        len(frame) > 0
        and np.isfinite(sd).all()
        and (sd >= 0).all()
        and (low >= 0).all()
        and (low <= high).all()
        and (high <= 1).all()
        and (sd > 0).any()
        and np.isfinite(p).all()
    )


@pytest.mark.slow
def test_every_dp_release_has_finite_error_bars_on_every_row(serve, pki):
    """Each mechanism an analyst may ask for over RPC, the default channel-aware posterior first: every row of
    top() (any order, and within an order) has a finite standard deviation and an interval in [0, 1]; the level
    is the analyst's (wider at 0.95 than at 0.5) and named in the frame's metadata beside what the error bars
    describe, which the release's statement ends with; a level outside (0, 1) is refused."""
    cur = serve(n=400, budget_epsilon=1000.0)
    with _client(cur, pki) as c:
        for mechanism in mechanisms.over_rpc():
            info = c.release(epsilon=20.0, mechanism=mechanism, force=True)
            assert info.error_bars.startswith("Error bars: each n-gram's") and info.error_bars in info.statement
            for order in (0, 2):
                top = c.top(info.release_id, k=10**6, order=order)
                assert _finite_bars(top), (mechanism, order, top)
                assert top.attrs["lac.error_bars"] == {"level": 0.9, "statement": info.error_bars}
            if mechanism == "posterior":
                assert info.params["channel"] == 1.0 and "public local channel" in info.error_bars
                narrow, wide = (c.top(info.release_id, k=50, level=lv) for lv in (0.5, 0.95))
                assert narrow.attrs["lac.error_bars"]["level"] == 0.5
                assert ((wide["noise_high"] - wide["noise_low"]) >= (narrow["noise_high"] - narrow["noise_low"])).all()
                assert (wide["noise_high"] - wide["noise_low"] > narrow["noise_high"] - narrow["noise_low"]).any()
                table = c.top(info.release_id, k=5, as_arrow=True)
                meta = json.loads(table.schema.metadata[b"lac.error_bars"])
                assert meta["level"] == 0.9 and meta["statement"] == info.error_bars
        with pytest.raises(ValueError, match="level must be a number in"):
            c.top(info.release_id, level=1.0)
    for bad in (0.0, 1.0, 1.5, math.nan):
        request = curator_pb2.TopNgramsRequest(release_id=info.release_id, level=bad)
        with pytest.raises(grpc.RpcError) as refused:
            _stub_call(cur, pki, "TopNgrams", request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "level must be in (0, 1)" in (
            refused.value.details()
        )


def test_a_release_without_error_bars_says_why(serve, pki, capsys):
    """A data-dependent release (NOT DP) has none: its noise scale is data-derived, which error bars would reveal;
    the wire leaves them unset and says why. A release stored before releases had error bars (no arrays, a record
    without them) has none either, and the CLI says so."""
    cur = serve(n=100, budget_epsilon=100.0, allow_data_dependent_releases=True)
    with _client(cur, pki) as c:
        dd = c.release(epsilon=5.0, mechanism="bayesian", sensitivity="bruteforce", force=True)
        top = c.top(dd.release_id, k=20)
        assert top["noise_sd"].isna().all() and top["noise_low"].isna().all() and top["noise_high"].isna().all()
        assert dd.error_bars.startswith("Error bars: none. The noise scale of this release is a function of the data")
        assert top.attrs["lac.error_bars"]["statement"] == dd.error_bars
        reply = _stub_call(cur, pki, "TopNgrams", curator_pb2.TopNgramsRequest(release_id=dd.release_id, k=5))
        assert not any(g.HasField("noise_sd") or g.HasField("noise_low") for g in reply.ngrams)
        rid = c.release(epsilon=5.0, mechanism="laplace", force=True).release_id
    found = cur.call(release.get_release(cur.curator, rid))
    assert found.errors is not None and found.errors.bars.family == "laplace"
    old = dataclasses.replace(found.record, release_id="made-before", request_id="", error_bars={})
    store = cur.curator.store
    cur.call(
        cur.curator.store_thread.run(
            store.add_release,
            old.release_id,
            old.to_json(),
            found.items,
            found.log_probs,
            found.pseudo_counts,
            [0],
            None,
            Budget(1),
        )
    )
    with _client(cur, pki) as c:
        top = c.top("made-before", k=5)
        assert top["noise_sd"].isna().all() and top.attrs["lac.error_bars"]["statement"] == ""
        assert c.release_info("made-before").error_bars == ""
    cert, key = pki.pem("analyst")
    flags = ["--server", cur.address, "--ca", pki.ca, "--cert", cert, "--key", key]
    code, out, _ = run_lac(capsys, "curator", "query", "top", *flags, "made-before", "-k", "2")
    assert code == 0 and out.rstrip().endswith("Error bars: none (a release made before releases had them).")


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
