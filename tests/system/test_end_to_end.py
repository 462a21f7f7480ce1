"""Both services as subprocesses on ephemeral ports; reports from the SDK; release checked
against the library run directly on the same input."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from scipy import stats

from lac.common import tls
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.suite import procs

USERS = 80


@pytest.fixture(scope="module")
def data():
    from lac.client.embedding import glove_default
    from lac.suite.data import load_users, prepare_corpora

    return glove_default(5_000), prepare_corpora(), load_users()[:USERS]


def test_pipeline_release_matches_library(tmp_path, data):
    from lac.analyst.client import new_request_id, release_with_retries
    from lac.client.acks import AckStatus
    from lac.client.localizer import Localizer
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.submit import ShufflerClient
    from lac.curator.base.ngrams import user_counts
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.release.bayesian import BayesianParams, bayesian_dp
    from lac.curator.service.config import CuratorConfig
    from lac.shuffler.auth import add_clients

    emb, corpora, texts = data
    pki = procs.LocalDeployment.create(tmp_path / "keys")
    analyst = pki.client_tls("analyst")
    tokens = add_clients(tmp_path / "shuffler" / "clients.tokens", [f"user-{i}" for i in range(USERS)])
    published = ["--embedding", emb.name, "--word-distance-bound", repr(emb.diameter()), "--epsilon-per-word", "10"]
    curator = procs.start(
        "curator",
        [
            "--state-dir",
            str(tmp_path / "curator"),
            "--public-corpus",
            str(corpora.public_corpus),
            *published,
            *pki.curator_args(),
        ],
        tmp_path,
        tls=analyst,
    )
    try:
        shuffler = procs.start(
            "shuffler",
            [
                "--state-dir",
                str(tmp_path / "shuffler"),
                "--curator",
                curator.address,
                "--min-batch",
                str(USERS),
                *pki.shuffler_args(),
            ],
            tmp_path,
            tls=pki.client_tls(),
        )
        try:
            with ShufflerClient(shuffler.address, pki.curator_public_key(), pki.client_tls(), token=tokens[0]) as c:
                deployment = c.deployment()  # the curator's configuration, relayed by the shuffler
            assert (deployment.embedding, deployment.epsilon_per_word) == (emb.name, 10.0)
            localizer = Localizer(emb, MultivariateLaplace(10.0), rng=np.random.default_rng(7), deployment=deployment)
            reports = localizer.privatize_many(texts)
            assert max(r.n_words for r in reports) <= deployment.max_report_words
            acks = []
            for report, token in zip(reports, tokens):  # each user: own token, one sealed report, over TLS
                with ShufflerClient(
                    shuffler.address, pki.curator_public_key(), pki.client_tls(), token=token
                ) as client:
                    acks += client.submit([report])
            assert [a.status for a in acks] == [AckStatus.STORED] * USERS
            with (
                ShufflerClient(shuffler.address, pki.curator_public_key(), pki.client_tls(), token=tokens[0]) as client,
                pytest.raises(grpc.RpcError) as over,
            ):
                client.submit(reports[:1])
            assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert any(k == "retry-after-seconds" for k, _ in over.value.trailing_metadata())
            operator = pki.client_tls("operator")
            with tls.channel(curator.address, operator) as ch:
                ops = curator_pb2_grpc.CuratorStub(ch)
                deadline = time.monotonic() + 60
                while ops.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).reports < USERS:
                    assert time.monotonic() < deadline, "batch did not reach the curator"
                    time.sleep(0.1)
            with tls.channel(curator.address, analyst) as ch:
                stub = curator_pb2_grpc.CuratorStub(ch)
                # a few dozen reports: the accuracy check would refuse both releases, so they are forced
                # the default release needs the local channel, sampled since the curator started: it waits the
                # curator's retry-after while the channel is not ready, as the analyst's client does
                default = release_with_retries(
                    stub.Release,
                    curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True, request_id=new_request_id()),
                    300,
                    channel_wait=900,
                )
                record = stub.Release(
                    curator_pb2.ReleaseRequest(mechanism="bayesian", epsilon=0.5, delta=1e-6, force=True), timeout=300
                )
                full = stub.GetRelease(curator_pb2.GetReleaseRequest(release_id=record.release_id), timeout=30)
            _check_who_holds_the_curator_key(pki, shuffler.process.pid, curator.process.pid)
        finally:
            assert shuffler.stop() == 0  # graceful SIGTERM shutdown
    finally:
        assert curator.stop() == 0

    import sqlite3

    from lac.common.v1 import reports_pb2

    with sqlite3.connect(tmp_path / "curator" / "curator.sqlite") as db:
        ((blob,),) = db.execute("SELECT privacy FROM batches").fetchall()
    stated = reports_pb2.BatchPrivacy.FromString(blob)  # the shuffler's statement, stored with the batch
    assert stated.n_reports == USERS and stated.distinct_clients and stated.statement
    assert stated.report_epsilon0 == pytest.approx(deployment.report_epsilon0)

    cc = CuratorConfig()
    vocab = public_vocabulary(
        corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items, tmp_path / "prior"
    )
    assert list(full.items) == list(vocab.items)
    U = user_counts(
        [[list(s) for s in r.sentences] for r in reports], vocab, C=cc.item_clamp, W=cc.max_items_per_report
    )
    expected = bayesian_dp(
        U,
        vocab.alpha,
        BayesianParams(
            epsilon=0.5,
            delta=1e-6,
            S=0.01,
            rho=0.5,
            C=cc.item_clamp,
            W=cc.max_items_per_report,
            count_clip=cc.item_count_clip,
        ),
        rng=np.random.default_rng(0),
    )
    from lac.curator.release.posterior import PosteriorParams

    assert default.mechanism == "posterior" and default.n_reports == 0  # an analyst never sees the exact count
    assert default.sigma == PosteriorParams(0.5, 1e-6, W=cc.max_items_per_report, C=cc.item_clamp).sigma
    assert record.n_reports == 0
    assert record.sensitivity_method == "sound" and record.differentially_private
    assert record.vocab_size == expected.vocab_size
    assert record.gamma == pytest.approx(expected.gamma, rel=1e-12)
    assert record.sigma == pytest.approx(expected.sigma, rel=1e-12)
    assert record.calibration == expected.calibration
    # Released log-probabilities = the library's pre-noise mean + N(0, σ²) noise, up to softmax's constant.
    residual = np.asarray(full.log_probs) - expected.mean
    residual -= residual.mean()
    assert stats.kstest(residual / record.sigma, "norm").pvalue > 1e-4  # false-alarm rate 1e-4


def _check_who_holds_the_curator_key(pki, shuffler_pid: int, curator_pid: int) -> None:
    """The shuffler process holds no curator private key; the same scan finds it in the curator."""
    from cryptography.hazmat.primitives import serialization
    from memscan import find_in_process

    key_file = next((pki.root / "curator-keys").glob("curator-*.key"))
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    pem_body = key_file.read_bytes().splitlines()[1]
    try:
        in_curator = find_in_process(curator_pid, [raw])
    except PermissionError:
        pytest.skip("no ptrace access to /proc/PID/mem here")
    assert in_curator == {raw}, "positive control: the scan must find the key in the curator process"
    assert find_in_process(shuffler_pid, [raw, pem_body]) == set()
