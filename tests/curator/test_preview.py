"""Accuracy preview and the refusal of releases whose noise would swamp the signal (issue 13, item 5).

The preview reads no report: a dry run spends nothing; an analyst's check without an assumed number
of reports uses a DP count (charged, kept for closed windows); an operator's uses the exact count.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from lac_testkit import DEPLOYMENT, batch_privacy, content

from lac.common import envelope, tls
from lac.common.privacy import PrivacyUnit
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps
from lac.curator.runner.preview import SNR, mean_sentence_words, predict

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "but",
    "some",
    "what",
    "there",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "your",
    "when",
    "up",
    "use",
    "word",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "would",
    "write",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "my",
    "sound",
    "no",
    "most",
    "number",
    "who",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "people",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
]


def _public_vocab(n_sentences: int = 4000, seed: int = 0) -> NgramVocabulary:
    """A public prior with a Zipf word law (shape only matters here)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    p /= p.sum()
    sents = [list(rng.choice(WORDS, size=int(rng.integers(5, 15)), p=p)) for _ in range(n_sentences)]
    return NgramVocabulary.from_sentences(sents, max_n=3, min_count=2, unknown_words=True)


VOCAB = _public_vocab()
UNIT = PrivacyUnit.report()


def _p(mechanism="posterior", eps=1.0, reports=None, unit=UNIT, target=0.5, **kw):
    spec = ReleaseSpec(epsilon=eps, delta=1e-6, mechanism=mechanism, **kw)
    return predict(spec, VOCAB, PublicCaps(W=100, C=3), unit, reports=reports, target_share=target)


def test_signal_share_grows_with_reports_and_epsilon():
    shares = [_p(reports=n).signal_share for n in (10, 100, 1000, 10_000, 100_000)]
    assert shares == sorted(shares) and shares[0] < 0.5 < shares[-1]
    by_eps = [_p(eps=e, reports=1000).signal_share for e in (0.1, 1.0, 10.0)]
    assert by_eps == sorted(by_eps)
    assert 9 < mean_sentence_words(VOCAB) < 10  # the corpus above: 5..14 words per sentence


@pytest.mark.parametrize("mechanism", ["posterior", "laplace"])
def test_reports_and_epsilon_needed_are_where_the_verdict_flips(mechanism):
    unknown = _p(mechanism)
    assert unknown.swamped is None and unknown.signal_share is None and unknown.reports_needed > 1
    assert f"{unknown.reports_needed:,} reports" in unknown.statement()
    n = unknown.reports_needed
    assert _p(mechanism, reports=n).swamped is False
    assert _p(mechanism, reports=max(1, n // 2)).swamped is True
    few = _p(mechanism, reports=max(1, n // 4))
    assert few.swamped and few.epsilon_needed > 1.0
    assert f"{n:,} reports" in few.advice and f"ε ≥ {few.epsilon_needed:.3g}" in few.advice
    assert _p(mechanism, eps=few.epsilon_needed * 1.001, reports=max(1, n // 4)).swamped is False
    # the resolvable items are those whose expected total reaches SNR noise standard deviations
    assert sum(_p(mechanism, reports=n).resolvable) > 0 and SNR == 2.0


def test_posterior_noise_grows_with_the_reports_one_user_sends_and_the_advice_says_so():
    one, many = _p(reports=500), _p(reports=500, unit=PrivacyUnit.client(2, 7, 86400))
    assert many.noise == pytest.approx(14 * one.noise, rel=0.02)  # σ is linear in the ℓ2 sensitivity m = 14
    assert many.swamped and "fewer accounting windows" in many.advice


def test_bayesian_sound_noise_does_not_shrink_with_reports():
    a, b = _p("bayesian", reports=100), _p("bayesian", reports=10**8)
    assert a.noise == b.noise > 1 and a.swamped and b.swamped and "posterior" in a.advice
    dd = _p("bayesian", reports=100, sensitivity="bruteforce")
    assert dd.swamped is None and not np.isfinite(dd.noise)
    assert _p("laplace-public", reports=10).swamped and _p("laplace-public", reports=10**9).reports_needed is None


# -- over RPC ---------------------------------------------------------------------------------

TEXTS = [
    ["the", "dog", "sleeps", "in", "the", "sun"],
    ["the", "fox", "is", "a", "small", "animal"],
    ["we", "walk", "the", "dog"],
    ["the", "sun", "is", "a", "star"],
]
OLD_WINDOW = 10  # a closed accounting window (1970): a DP count over it can be reused


def _ingest(address, seal, n, window, credentials=None):
    ch = tls.channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with ch:
        curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id=f"b{window}",
                reports=[seal(content(TEXTS[i % 4])) for i in range(n)],
                privacy=batch_privacy(n, window=window),
            ),
            timeout=30,
        )


def _spent(stub, window):
    return {w.window: w.spent_epsilon for w in stub.GetBudget(curator_pb2.BudgetRequest(), timeout=5).windows}.get(
        window, 0.0
    )


def test_operator_dry_run_spends_nothing_and_a_swamped_release_is_refused_unless_forced(
    start_curator, curator_public_key
):
    cur = start_curator(min_signal_share=0.25)  # insecure: the caller holds every role, operator included
    _ingest(cur.address, lambda c: envelope.seal(c, curator_public_key), 30, OLD_WINDOW)
    with grpc.insecure_channel(cur.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        req = curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-6)
        p = stub.PreviewRelease(req, timeout=30)
        assert p.reports == 30 and "exact" in p.reports_source and p.swamped and p.target_share == 0.25
        assert p.HasField("reports_needed") and p.reports_needed > 30 and "reports" in p.advice
        assert p.statement.startswith("posterior at (ε, δ) = (1, 1e-06): noise σ = ")
        assumed = stub.PreviewRelease(curator_pb2.ReleaseRequest(epsilon=1.0, expected_reports=10**7), timeout=30)
        assert assumed.reports == 10**7 and assumed.reports_source == "assumed by the request" and not assumed.swamped
        assert _spent(stub, OLD_WINDOW) == 0.0  # previews are free
        with pytest.raises(grpc.RpcError) as err:
            stub.Release(req, timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "would swamp the signal" in err.value.details() and "nothing was spent" in err.value.details()
        assert "--force" in err.value.details() and f"{p.reports_needed:,} reports" in err.value.details()
        assert _spent(stub, OLD_WINDOW) == 0.0 and not stub.ListReleases(curator_pb2.ListReleasesRequest()).releases
        req.force = True
        rec = stub.Release(req, timeout=60)
        assert rec.differentially_private and _spent(stub, OLD_WINDOW) == pytest.approx(1.0)
        bad = stub.PreviewRelease  # invalid requests are INVALID_ARGUMENT, as for Release
        with pytest.raises(grpc.RpcError) as err:
            bad(curator_pb2.ReleaseRequest(epsilon=-1.0), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_analyst_check_uses_a_charged_dp_count_reused_for_closed_windows(pki, start_curator, curator_public_key):
    cert, key = pki.pem("curator")
    cur = start_curator(
        insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, min_signal_share=0.25, count_epsilon=2.0
    )  # Laplace scale 0.5: a stable verdict
    _ingest(cur.address, lambda c: envelope.seal(c, curator_public_key), 30, OLD_WINDOW, pki.client_tls("shuffler"))
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        req = curator_pb2.ReleaseRequest(epsilon=1.0, delta=1e-6)
        p = stub.PreviewRelease(req, timeout=30)
        assert not p.HasField("reports") and not p.HasField("swamped") and p.reports_needed > 0  # no count yet
        assert "needs at least" in p.statement
        assert _spent(stub, OLD_WINDOW) == 0.0
        with pytest.raises(grpc.RpcError) as err:
            stub.Release(req, timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "DP count" in err.value.details() and "only the DP count was charged (ε = 2)" in err.value.details()
        assert _spent(stub, OLD_WINDOW) == pytest.approx(2.0)
        again = stub.PreviewRelease(req, timeout=30)  # the kept DP count: free, and the verdict is back
        assert again.HasField("reports") and "DP count" in again.reports_source and again.swamped
        with pytest.raises(grpc.RpcError):
            stub.Release(req, timeout=60)
        assert _spent(stub, OLD_WINDOW) == pytest.approx(2.0)  # reused: the window had closed before the count
        req.expected_reports = 10**7  # the analyst's own assumption: no count needed, and the check passes
        assert stub.Release(req, timeout=60).differentially_private
        assert _spent(stub, OLD_WINDOW) == pytest.approx(3.0)


@pytest.fixture
def analyst_curator(pki, start_curator, curator_public_key):
    """A TLS curator with the accuracy check on (a DP count costs ε = 2) and an analyst's stub."""
    cert, key = pki.pem("curator")
    cur = start_curator(
        insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, min_signal_share=0.25, count_epsilon=2.0
    )
    with tls.channel(cur.address, pki.client_tls("analyst")) as ch:
        yield cur, curator_pb2_grpc.CuratorStub(ch)


def _ledger(stub):
    return {w.window: w.spent_epsilon for w in stub.GetBudget(curator_pb2.BudgetRequest(), timeout=5).windows}


def test_a_release_over_negative_windows_is_refused_and_charges_nothing(analyst_curator, pki, curator_public_key):
    """Windows count from 0 (the Unix epoch): a release, forced or not, or a preview over any window
    before it is INVALID_ARGUMENT naming the window, with no DP count taken and nothing charged."""
    cur, stub = analyst_curator
    _ingest(cur.address, lambda c: envelope.seal(c, curator_public_key), 30, OLD_WINDOW, pki.client_tls("shuffler"))
    before = _ledger(stub)
    for first, last, force in ((-5, -1, False), (-1, -1, True), (-2, OLD_WINDOW, False)):
        req = curator_pb2.ReleaseRequest(epsilon=1.0, first_window=first, last_window=last, force=force)
        for call in (stub.Release, stub.PreviewRelease):
            with pytest.raises(grpc.RpcError) as err:
                call(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert f"window {first}" in err.value.details() and "0" in err.value.details()
    assert _ledger(stub) == before and not any(w < 0 for w in _ledger(stub))


def test_a_refused_release_charges_its_dp_count_once(analyst_curator, pki, curator_public_key):
    """The current window (still open) and a past window with no report: the check's DP count is
    charged once; asking again reuses it (a count of an open window says so) and spends nothing.
    An empty window is not refused for being empty, which would disclose it un-noised: its noisy
    count is what refuses it."""
    cur, stub = analyst_curator
    now = DEPLOYMENT.window(time.time())
    _ingest(cur.address, lambda c: envelope.seal(c, curator_public_key), 30, now, pki.client_tls("shuffler"))
    for window in (now, OLD_WINDOW):
        req = curator_pb2.ReleaseRequest(epsilon=1.0, first_window=window, last_window=window)
        for attempt in range(3):
            with pytest.raises(grpc.RpcError) as err:
                stub.Release(req, timeout=60)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
            assert "release refused" in err.value.details() and "DP count" in err.value.details()
            assert _ledger(stub).get(window) == pytest.approx(2.0), (window, attempt)  # one count, once
            if attempt:
                assert "nothing was spent" in err.value.details()
                if window == now:
                    assert "still open" in err.value.details()
