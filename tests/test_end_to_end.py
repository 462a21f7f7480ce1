"""Both services as subprocesses on ephemeral ports; reports from the SDK; release checked
against the library run directly on the same input."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from scipy import stats

from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2
from lac.suite import procs

USERS = 80


@pytest.fixture(scope="module")
def data():
    from lac.client.embedding import glove_default
    from lac.suite.data import load_users, prepare_corpora

    return glove_default(5_000), prepare_corpora(), load_users()[:USERS]


def test_pipeline_release_matches_library(tmp_path, data):
    from lac.client.localizer import Localizer
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.submit import ShufflerClient
    from lac.curator.bayesian import BayesianParams
    from lac.curator.config import CuratorConfig
    from lac.curator.prior import public_vocabulary
    from lac.curator.service import compute_release

    emb, corpora, texts = data
    curator = procs.start("curator", ["--state-dir", str(tmp_path / "curator"),
                                      "--public-corpus", str(corpora.public_corpus)], tmp_path)
    try:
        shuffler = procs.start("shuffler", ["--state-dir", str(tmp_path / "shuffler"),
                                            "--curator", curator.address, "--min-batch", str(USERS)], tmp_path)
        try:
            reports = Localizer(emb, MultivariateLaplace(10.0), rng=np.random.default_rng(7)).privatize_many(texts)
            with ShufflerClient(shuffler.address, batch_size=25) as client:
                acks = client.submit(reports)
            assert [a.status for a in acks] == [shuffler_pb2.ACK_STATUS_STORED] * USERS
            with grpc.insecure_channel(curator.address) as ch:
                stub = curator_pb2_grpc.CuratorStub(ch)
                deadline = time.monotonic() + 60
                while stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).reports < USERS:
                    assert time.monotonic() < deadline, "batch did not reach the curator"
                    time.sleep(0.1)
                record = stub.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6), timeout=300)
                full = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=record.release_id,
                                                                     include_pre_noise_mean=True), timeout=30)
        finally:
            assert shuffler.stop() == 0  # graceful SIGTERM shutdown
    finally:
        assert curator.stop() == 0

    cc = CuratorConfig()
    vocab = public_vocabulary(corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items,
                              tmp_path / "prior")
    assert list(full.items) == list(vocab.items)
    expected = compute_release([[list(s) for s in r.sentences] for r in reports], vocab,
                               BayesianParams(epsilon=0.5, delta=1e-6), cc.max_items_per_report,
                               rng=np.random.default_rng(0))
    assert record.n_reports == expected.n_users == USERS
    assert record.vocab_size == expected.vocab_size
    assert record.gamma == pytest.approx(expected.gamma, rel=1e-12)
    assert record.sigma == pytest.approx(expected.sigma, rel=1e-12)
    assert record.calibration == expected.calibration
    np.testing.assert_allclose(np.asarray(full.pre_noise_mean), expected.mean, rtol=0, atol=1e-12)
    # Released log-probabilities = mean + N(0, σ²) noise, up to softmax's additive constant.
    residual = np.asarray(full.log_probs) - expected.mean
    residual -= residual.mean()
    assert stats.kstest(residual / record.sigma, "norm").pvalue > 1e-4  # false-alarm rate 1e-4
