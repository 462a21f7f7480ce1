"""The curator service: segments, ledger, quarantine, replay window, mechanisms and queries over RPC."""

from __future__ import annotations

import os
import re

import grpc
import numpy as np
import pytest

from lac.common import envelope
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2
from lac.curator.ngrams import NgramVocabulary, user_counts
from lac.curator.service import make_segment, segment_counts
from lac.curator.store import CuratorStore, Quarantined, Segment

TEXTS = [["the", "dog", "sleeps", "in", "the", "sun"], ["the", "fox", "is", "a", "small", "animal"],
         ["we", "walk", "the", "dog"], ["the", "sun", "is", "a", "star"], ["the", "dog", "the", "dog", "the"]]


def content(*sentences, report_id=None) -> reports_pb2.ReportContent:
    return reports_pb2.ReportContent(report_id=report_id or os.urandom(16),
                                     sentences=[reports_pb2.Sentence(tokens=s) for s in sentences])


def random_reports(rng, words, n):
    return [[list(rng.choice(words, size=rng.integers(0, 12))) for _ in range(rng.integers(0, 4))] for _ in range(n)]


@pytest.mark.parametrize("C,W", [(1, None), (2, 3), (3, 7), (1, 1)])
def test_segments_reproduce_user_counts(C, W, tmp_path):
    rng = np.random.default_rng(5)
    words = np.array("the a dog fox sun is in walk we small zebra star park".split())
    vocab = NgramVocabulary.from_sentences([list(rng.choice(words, 8)) for _ in range(40)], max_n=3)
    reports = random_reports(rng, words, 300)
    segs = []
    for i, chunk in enumerate((reports[:120], reports[120:121], reports[121:])):
        make_segment(chunk, vocab).save(tmp_path / f"{i}.npz")
        segs.append(Segment.load(tmp_path / f"{i}.npz"))
    got = segment_counts(segs, vocab, C, W)
    want = user_counts(reports, vocab, C, W)
    assert got.shape == want.shape and (got != want).nnz == 0
    assert got.dtype == want.dtype and got.has_canonical_format
    # A smaller vocabulary later: items it lacks are dropped before the W cap, as re-counting would.
    small = NgramVocabulary(vocab.items[::2], vocab.alpha[::2], vocab.max_n)
    assert (segment_counts(segs, small, C, W) != user_counts(reports, small, C, W)).nnz == 0


def test_quarantine_keeps_only_the_newest_rows(tmp_path):
    store = CuratorStore(tmp_path, quarantine_max_rows=5)

    def seg(keep):
        raise AssertionError("no report is kept")

    for b in range(4):
        bad = [Quarantined("invalid", f"batch {b} report {i}", bytes([b, i])) for i in range(3)]
        assert store.add_batch(f"b{b}", [], seg, bad, 86400.0).rejects == {"invalid": 3}
    assert store.counts()["quarantined"] == 5
    assert [r[3] for r in store.quarantine()] == [bytes([3, 2]), bytes([3, 1]), bytes([3, 0]),
                                                  bytes([2, 2]), bytes([2, 1])]
    assert store.rejects() == {"invalid": 12}  # the totals are kept


def test_replay_window_prunes_old_ids(tmp_path):
    store = CuratorStore(tmp_path)
    rid = os.urandom(16)

    def seg(keep):
        return Segment(("a",), np.arange(len(keep) + 1, dtype=np.int64), np.zeros(len(keep), np.int32),
                       np.ones(len(keep), np.int32))

    day = 86400.0
    assert store.add_batch("b1", [rid, rid], seg, [], 30 * day, now=0.0).rejects == {"replayed_report_id": 1}
    assert store.add_batch("b2", [rid], seg, [], 30 * day, now=29 * day).rejects == {"replayed_report_id": 1}
    assert store.add_batch("b2", [rid], seg, [], 30 * day, now=29 * day).duplicate
    r = store.add_batch("b3", [rid], seg, [], 30 * day, now=31 * day)  # forgotten after the window
    assert (r.accepted, r.rejected) == (1, 0)
    assert store.counts()["reports"] == 2 and sum(s.n_reports for s in store.segments()) == 2
    store.close()


@pytest.fixture
def seal(curator_public_key):
    return lambda c: envelope.seal(c, curator_public_key)


def ingest(ch, batch_id, payloads):
    return curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
        curator_pb2.IngestBatchRequest(batch_id=batch_id, reports=payloads), timeout=30)


def code_of(fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code(), err.value.details()


def test_quarantine_keeps_the_rest_and_survives_restart(start_curator, seal, curator_public_key, tmp_path,
                                                       monkeypatch):
    cur = start_curator(state_dir=tmp_path / "c")
    good = [seal(content(t)) for t in TEXTS]
    kid = curator_public_key.key_id
    bad = [
        reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id=kid, data=b"short"),  # decrypt_failed
        reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="0" * 16, data=good[0].data),  # unknown_key
        envelope.seal_insecure(content(["x"])),  # plaintext_refused
        seal(content(["bad token"])),  # invalid
        seal(content(["a" * 100])),  # invalid
        reports_pb2.SealedPayload(),  # unsupported encoding
    ]
    original = envelope.open_payload

    def flaky_open(sealed, *args, **kw):  # a bug or library error while opening one report
        if sealed.key_id == "boom":
            raise RuntimeError("boom")
        return original(sealed, *args, **kw)

    monkeypatch.setattr(envelope, "open_payload", flaky_open)
    bad.append(reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="boom", data=b"x"))
    with grpc.insecure_channel(cur.address) as ch:
        reply = ingest(ch, "b1", good[:3] + bad + good[3:])
        assert (reply.accepted, reply.rejected, reply.duplicate) == (5, 7, False)
        assert ingest(ch, "b1", good).duplicate
        status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert status.reports == 5 and status.quarantined == 7
        assert dict(status.rejects) == {"decrypt_failed": 1, "unknown_key": 1, "plaintext_refused": 1,
                                        "invalid": 2, "unsupported_encoding": 1, "internal": 1}
    cur.stop()
    rows = CuratorStore(tmp_path / "c").quarantine()
    assert {r[3] for r in rows} == {b.SerializeToString() for b in bad}
    cur2 = start_curator(state_dir=tmp_path / "c")
    with grpc.insecure_channel(cur2.address) as ch:
        r = ingest(ch, "b2", [seal(content(["the", "dog"])), good[0]])  # good[0]: replayed report id
        assert (r.accepted, r.rejected) == (1, 1)
        stub = curator_pb2_grpc.CuratorStub(ch)
        status = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert status.reports == 6 and status.rejects["replayed_report_id"] == 1
        rec = stub.Release(curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6), timeout=60)
        assert rec.n_reports == 6
    cur2.stop()
    seg = next((tmp_path / "c" / "segments").iterdir())
    seg.write_bytes(b"garbage")
    cur3 = start_curator(state_dir=tmp_path / "c")
    with grpc.insecure_channel(cur3.address) as ch:
        code, details = code_of(lambda: curator_pb2_grpc.CuratorStub(ch).Release(
            curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6), timeout=60))
        assert code == grpc.StatusCode.DATA_LOSS and seg.name in details


def test_release_counts_match_the_text_path(start_curator, seal, public_corpus):
    from lac.curator.bayesian import BayesianParams
    from lac.curator.service import compute_release

    cur = start_curator(max_items_per_report=4)
    with grpc.insecure_channel(cur.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS[:3]])
        ingest(ch, "b2", [seal(content(t, ["the", "sun"])) for t in TEXTS[2:]])
        stub = curator_pb2_grpc.CuratorStub(ch)
        rec = stub.Release(curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6, c=2), timeout=60)
        got = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=rec.release_id,
                                                            include_pre_noise_mean=True), timeout=10)
    from lac.curator.config import CuratorConfig
    from lac.curator.prior import public_vocabulary

    cfg = CuratorConfig(public_corpus=public_corpus, vocab_min_count=1)
    vocab = public_vocabulary(public_corpus, 3, 1, cfg.vocab_max_items, public_corpus.parent / "prior-check")
    reports = [[t] for t in TEXTS[:3]] + [[t, ["the", "sun"]] for t in TEXTS[2:]]
    want = compute_release(reports, vocab, BayesianParams(epsilon=1, delta=1e-6, C=2), 4)
    assert list(got.items) == list(vocab.items)
    np.testing.assert_array_equal(np.array(got.pre_noise_mean), want.mean)
    assert rec.gamma == pytest.approx(want.gamma, rel=1e-12) and rec.n_reports == 6


def test_ledger_refuses_overspending_and_persists(start_curator, seal, tmp_path):
    cur = start_curator(state_dir=tmp_path / "c", budget_epsilon=1.0, budget_delta=1e-5)
    with grpc.insecure_channel(cur.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS])
        stub = curator_pb2_grpc.CuratorStub(ch)
        r1 = stub.Release(curator_pb2.ReleaseRequest(epsilon=0.6, delta=4e-6), timeout=60)
        assert (r1.ledger_epsilon, r1.ledger_delta) == (0.6, 4e-6)
        code, details = code_of(lambda: stub.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6),
                                                     timeout=60))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert re.search(r"requested .*0\.5.*spent .*0\.6.*remaining .*0\.4", details), details
        # Queries are free.
        stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=r1.release_id, k=3), timeout=10)
        stub.Perplexity(curator_pb2.PerplexityRequest(release_id=r1.release_id, text="The dog."), timeout=10)
        s = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert (s.spent_epsilon, s.remaining_epsilon, s.releases) == (0.6, pytest.approx(0.4), 1)
    cur.stop()
    cur2 = start_curator(state_dir=tmp_path / "c", budget_epsilon=1.0, budget_delta=1e-5)
    with grpc.insecure_channel(cur2.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        assert stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).spent_epsilon == 0.6
        code, _ = code_of(lambda: stub.Release(curator_pb2.ReleaseRequest(epsilon=0.3, delta=7e-6), timeout=60))
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # δ would overspend
        r2 = stub.Release(curator_pb2.ReleaseRequest(epsilon=0.4, delta=6e-6), timeout=60)
        assert r2.n_reports == len(TEXTS)
        s = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert s.spent_epsilon == pytest.approx(1.0) and s.releases == 2


def test_mechanisms_over_rpc(start_curator, seal):
    cur = start_curator(n_max=1000)
    with grpc.insecure_channel(cur.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS * 4])
        stub = curator_pb2_grpc.CuratorStub(ch)

        def release(**kw):
            return stub.Release(curator_pb2.ReleaseRequest(**kw), timeout=120)

        for sens in ("bruteforce", "claim1", "sound"):
            r = release(epsilon=1, delta=1e-6, sensitivity=sens)
            assert r.sensitivity_method == sens and r.data_dependent == (sens != "sound") and r.sigma > 0
            assert r.params["W"] == 100 and r.differentially_private
        assert release(epsilon=1, delta=1e-6, sensitivity="sound", n_max=50).params["n_max"] == 50
        code, _ = code_of(lambda: release(epsilon=1, delta=1e-6, sensitivity="sound", n_max=5))
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # 20 reports > n_max
        e = release(mechanism="endtoend", epsilon=1, delta=1e-6)
        assert e.mechanism == "endtoend" and e.laplace_scale > 0 and "epsilon_select" in e.params
        lap = release(mechanism="laplace", epsilon=1)
        assert lap.delta == 0 and lap.laplace_scale == pytest.approx(100.0) and lap.ledger_delta == 0
        lp = release(mechanism="laplace-public", epsilon=1, public_sensitivity="observed")
        assert lp.data_dependent and lp.sensitivity_method == "observed"
        code, details = code_of(lambda: release(mechanism="kanon", epsilon=1, k=2))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "NOT differentially private" in details
        full = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=lap.release_id), timeout=10)
        finite = np.isfinite(full.log_probs)
        np.testing.assert_array_equal(np.mod(np.array(full.log_probs)[finite], 2.0**-40), 0.0)
        status = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert status.spent_epsilon == pytest.approx(7.0) and status.spent_delta == pytest.approx(5e-6)

    cur2 = start_curator(allow_non_dp_releases=True)
    with grpc.insecure_channel(cur2.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS * 4])
        k = curator_pb2_grpc.CuratorStub(ch).Release(curator_pb2.ReleaseRequest(mechanism="kanon", k=4), timeout=60)
        assert not k.differentially_private and k.epsilon == float("inf") and "NOT differentially private" in k.statement
        s = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert s.spent_epsilon == 0 and s.releases == 1


def test_queries(start_curator, seal):
    from lac.curator.lm import NgramModel

    cur = start_curator()
    with grpc.insecure_channel(cur.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS * 4])
        stub = curator_pb2_grpc.CuratorStub(ch)
        rid = stub.Release(curator_pb2.ReleaseRequest(epsilon=5, delta=1e-6), timeout=60).release_id
        full = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=rid), timeout=10)
        model = NgramModel(list(full.items), np.array(full.log_probs), 3)
        probs = stub.NgramProbabilities(curator_pb2.NgramProbabilitiesRequest(
            release_id=rid, ngrams=["the dog", "the  dog", "no such"]), timeout=10).ngrams
        assert [g.ngram for g in probs] == ["the dog", "the dog", "no such"]
        assert probs[0].probability == pytest.approx(model.prob("the dog")) and probs[2].probability == 0
        nw = stub.NextWord(curator_pb2.NextWordRequest(release_id=rid, context="zebra the", k=3), timeout=10)
        assert nw.context_used == "the" and [(w.ngram, w.probability) for w in nw.words] == \
            [(w, pytest.approx(p)) for w, p in model.next_word("the", 3)]
        ppl = stub.Perplexity(curator_pb2.PerplexityRequest(release_id=rid, text="The dog sleeps. Zebras!"),
                              timeout=10)
        assert ppl.perplexity == pytest.approx(model.perplexity([["the", "dog", "sleeps"], ["zebras"]]))
        assert (ppl.n_sentences, ppl.n_tokens, ppl.n_out_of_vocabulary) == (2, 6, 1)
        arpa = "".join(c.text for c in stub.ExportArpa(curator_pb2.ExportArpaRequest(release_id=rid), timeout=30))
        assert arpa == model.arpa() and arpa.startswith("\n\\data\\\n")

        for call in (lambda: stub.NextWord(curator_pb2.NextWordRequest(release_id="nope"), timeout=5),
                     lambda: stub.Perplexity(curator_pb2.PerplexityRequest(release_id="nope", text="a"), timeout=5),
                     lambda: list(stub.ExportArpa(curator_pb2.ExportArpaRequest(release_id="nope"), timeout=5)),
                     lambda: stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=""), timeout=5)):
            assert code_of(call)[0] == grpc.StatusCode.NOT_FOUND
        for call in (lambda: stub.NgramProbabilities(curator_pb2.NgramProbabilitiesRequest(
                         release_id=rid, ngrams=["a b c d"]), timeout=5),
                     lambda: stub.NgramProbabilities(curator_pb2.NgramProbabilitiesRequest(release_id=rid), timeout=5),
                     lambda: stub.Perplexity(curator_pb2.PerplexityRequest(release_id=rid, text="..."), timeout=5),
                     lambda: stub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=rid, order=7), timeout=5)):
            assert code_of(call)[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_cli_release_status_and_queries(start_curator, seal, tmp_path, capsys):
    import json

    from lac.common.cli import main
    from lac.curator.lm import NgramModel

    def run(*argv):
        with pytest.raises(SystemExit) as e:
            main(list(argv))
        assert e.value.code == 0
        return capsys.readouterr().out

    cur = start_curator(budget_epsilon=3.0)
    srv = ("--server", cur.address, "--insecure")
    with grpc.insecure_channel(cur.address) as ch:
        ingest(ch, "b1", [seal(content(t)) for t in TEXTS * 4])
    rec = json.loads(run("curator", "release", *srv, "--json", "--mechanism", "bayesian", "--sensitivity", "sound",
                         "--n-max", "100", "--epsilon", "2", "--delta", "1e-6"))
    rid = rec["release_id"]
    assert rec["sensitivity_method"] == "sound" and rec["params"]["n_max"] == 100
    status = run("curator", "status", *srv)
    assert "spent (2, 1e-06); remaining (1, 9e-06)" in status
    assert rid in run("curator", "query", "releases", *srv)
    assert len(run("curator", "query", "top", *srv, rid, "-k", "3").strip().split("\n")) == 3
    out = json.loads(run("curator", "query", "prob", *srv, "--json", rid, "the dog", "zebra"))
    assert out["ngrams"][0]["probability"] > 0 and "probability" not in out["ngrams"][1]
    assert "context used: the" in run("curator", "query", "next", *srv, rid, "zebra the", "-k", "2")
    (tmp_path / "t.txt").write_text("The dog sleeps in the sun.")
    assert "perplexity" in run("curator", "query", "perplexity", *srv, rid, f"@{tmp_path / 't.txt'}")
    run("curator", "query", "arpa", *srv, rid, "--out", str(tmp_path / "r.arpa"))
    arpa = (tmp_path / "r.arpa").read_text()
    assert arpa.startswith("\n\\data\\\nngram 1=") and arpa.endswith("\\end\\\n")
    with grpc.insecure_channel(cur.address) as ch:
        full = curator_pb2_grpc.CuratorStub(ch).GetRelease(curator_pb2.GetReleaseRequest(release_id=rid), timeout=10)
    assert arpa == NgramModel(list(full.items), np.array(full.log_probs), 3).arpa()
