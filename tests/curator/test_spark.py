"""Releases (``lac.curator.engines.spark``) and ingest (``lac.curator.ingest.spark``) on Apache Spark with a
real local Spark (``local[2]``): every mechanism gives the same release, bit for bit, as ``LocalEngine`` on the
same segments, through a classic session and through a Spark Connect session; the curator service selects Spark
from its flags. One Spark session for the module (startup takes seconds); it also serves Spark Connect."""

from __future__ import annotations

import json
import operator
import subprocess
import sys
from functools import partial

import grpc
import numpy as np
import pytest
from curator_testkit import SEGMENT_WORDS as WORDS
from curator_testkit import random_stored
from lac_testkit import batch_privacy, content, free_port
from test_ingest import good_reports, mixed_batch

from lac.common import envelope
from lac.common.errors import DataLoss
from lac.common.privacy import PrivacyUnit
from lac.common.text import sentences
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.base.ngrams import NgramVocabulary, ReportItems
from lac.curator.engines.local import LOCAL
from lac.curator.engines.spark import SparkEngine
from lac.curator.ingest.spark import SparkIngest
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import PublicCaps, StoredReports, block_stats
from lac.curator.runner.run import run
from lac.curator.store import segments
from lac.curator.store.store import CuratorStore

CAPS = PublicCaps(W=7, C=2, count_clip=50)


@pytest.fixture(scope="module")
def spark():
    """A classic local[2] session that also serves Spark Connect on a loopback port."""
    port = free_port()
    engine = SparkEngine.start(
        "local[2]",
        conf={
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
        },
    )
    engine.connect_url = f"sc://127.0.0.1:{port}"
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def connect(spark):
    """A Spark Connect session to the module's server (the client speaks gRPC, the plan carries the UDF)."""
    engine = SparkEngine.start(spark.connect_url)
    assert type(engine.session).__module__ == "pyspark.sql.connect.session"
    yield engine
    engine.stop()


@pytest.fixture(params=["classic", "connect"])
def engine(request, spark):
    return spark if request.param == "classic" else request.getfixturevalue("connect")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Six segments of random reports (some empty, some longer than W, words outside the vocabulary)."""
    return random_stored(
        tmp_path_factory.mktemp("segments"), np.random.default_rng(23), 6, lambda k: (0 if k == 2 else 1, 90)
    )


SPECS = [
    ReleaseSpec(epsilon=1.0),
    ReleaseSpec(epsilon=1.0, discovery=False),
    ReleaseSpec(epsilon=1.0, mechanism="bayesian"),
    ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce"),
    ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="claim1"),
    ReleaseSpec(epsilon=1.0, mechanism="laplace"),
    ReleaseSpec(epsilon=1.0, mechanism="laplace-public"),
]


def assert_same_release(a, b) -> None:
    np.testing.assert_array_equal(a.log_probs, b.log_probs)
    if b.pseudo_counts is None:
        assert a.pseudo_counts is None
    else:
        np.testing.assert_array_equal(a.pseudo_counts, b.pseudo_counts)
    assert a.items == b.items and a.statement == b.statement
    for k in ("gamma", "sigma", "laplace_scale", "n_reports", "threshold", "discovered", "params"):
        assert getattr(a, k) == getattr(b, k), k


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.mechanism}-{s.sensitivity}-{int(s.discovery)}")
def test_spark_release_is_bit_identical_to_local(engine, stored, spec):
    unit = PrivacyUnit.client(2, 3, 86400)
    on_spark = run(stored, stored.vocab, spec, CAPS, unit, np.random.default_rng(5), engine=engine)
    local = run(stored, stored.vocab, spec, CAPS, unit, np.random.default_rng(5), engine=LOCAL)
    assert local.n_reports > 0
    assert_same_release(on_spark, local)
    if spec.sensitivity == "bruteforce":
        assert on_spark.gamma > 0


@pytest.mark.slow
def test_folds_keep_part_order_across_waves(spark, stored):
    small = SparkEngine(spark.session, parts_per_job=2, first_wave=1)
    sizes = small.fold(stored, operator.attrgetter("n_reports"), lambda acc, n: acc + [n], [])
    assert sizes == LOCAL.fold(stored, operator.attrgetter("n_reports"), lambda acc, n: acc + [n], [])
    assert len(sizes) == 6
    assert small.fold(StoredReports([], stored.vocab), len, operator.add, "none") == "none"  # no Spark job
    gone = StoredReports([stored.paths[0], stored.paths[0].with_name("gone.parquet")], stored.vocab)
    with pytest.raises(DataLoss, match="gone.parquet of an acknowledged batch is missing or corrupt"):
        small.fold(gone, operator.attrgetter("n_reports"), operator.add, 0)


def _vocabulary_sized(n_items: int) -> NgramVocabulary:
    return NgramVocabulary(
        tuple(f"w{j}" for j in range(n_items)), np.random.default_rng(7).poisson(5.0, n_items) + 1.0, 1
    )


@pytest.mark.slow
def test_vocabulary_sized_partials_of_a_million_items(engine, tmp_path):
    """Partials of 16 MB each (CountStats over 1M items, uncompressed), collected in waves."""
    n_items = 1_000_000
    vocab = _vocabulary_sized(n_items)
    rng = np.random.default_rng(3)
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"big{k}.parquet")
        segments.write(paths[-1], _distinct_block(rng, 2000, n_items), {"batch_id": f"big{k}"})
    reports = StoredReports(paths, vocab)
    fn = partial(block_stats, vocab=vocab, C=2, W=50)
    big = SparkEngine(engine.session, compress_level=0, first_wave=1, max_result_bytes=40 << 20)
    got = big.fold(reports, fn, lambda acc, s: s if acc is None else acc + s, None)
    want = LOCAL.fold(reports, fn, lambda acc, s: s if acc is None else acc + s, None)
    np.testing.assert_array_equal(got.c, want.c)
    np.testing.assert_array_equal(got.N, want.N)
    assert got.n_users == want.n_users == 6000 and got.c.nbytes == 8 * n_items
    assert big.last_waves == [1, 2]  # a first part alone, then as many 16 MB partials as fit in 40 MB
    spec = ReleaseSpec(epsilon=1.0, mechanism="bayesian")
    caps = PublicCaps(W=50, C=2)
    assert_same_release(
        run(reports, vocab, spec, caps, rng=np.random.default_rng(1), engine=engine),
        run(reports, vocab, spec, caps, rng=np.random.default_rng(1), engine=LOCAL),
    )


def _distinct_block(rng, n: int, n_items: int) -> ReportItems:
    """``n`` reports of 1..39 distinct random items of ``w0 .. w<n_items - 1>`` each."""
    rows = [np.unique(rng.integers(0, n_items, int(rng.integers(1, 40)))) for _ in range(n)]
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])]).astype(np.int64)
    used, local = np.unique(np.concatenate(rows), return_inverse=True)
    return ReportItems(
        indptr, local.astype(np.int32), np.ones(local.size, dtype=np.int32), tuple(f"w{j}" for j in used)
    )


@pytest.mark.slow
def test_serve_flags_select_spark(spark, start_curator, tmp_path, public_corpus, capsys):
    """``lac curator serve --engine spark --spark-master local[2]``: the curator computes its releases on
    Spark (the running session), and the brute-force γ over RPC equals LocalEngine's on its segments."""
    from lac.common import config as cfg
    from lac.common.cli import build_parser, main
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service.config import ENV_PREFIX, CuratorConfig

    args = build_parser().parse_args(
        [
            "curator",
            "serve",
            "--engine",
            "spark",
            "--spark-master",
            "local[2]",
            "--state-dir",
            str(tmp_path / "c"),
            "--insecure",
        ]
    )
    config = cfg.from_args(CuratorConfig, ENV_PREFIX, args)
    assert (config.engine, config.spark_master) == ("spark", "local[2]")
    cur = start_curator(
        engine=config.engine,
        spark_master=config.spark_master,
        state_dir=config.state_dir,
        allow_plaintext_payloads=True,
        allow_data_dependent_releases=True,
    )
    rng = np.random.default_rng(4)
    with grpc.insecure_channel(cur.address) as ch:
        for b in range(3):
            payloads = [
                envelope.seal_insecure(
                    content(
                        *[
                            list(rng.choice(WORDS, size=int(rng.integers(1, 12))))
                            for _ in range(int(rng.integers(1, 3)))
                        ]
                    )
                )
                for _ in range(30)
            ]
            curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
                curator_pb2.IngestBatchRequest(batch_id=f"b{b}", reports=payloads), timeout=60
            )
    jobs = len(spark.session.sparkContext.statusTracker().getJobIdsForGroup())
    with pytest.raises(SystemExit) as e:
        main(
            [
                "curator",
                "release",
                "--server",
                cur.address,
                "--insecure",
                "--json",
                "--mechanism",
                "bayesian",
                "--sensitivity",
                "bruteforce",
                "--epsilon",
                "1",
            ]
        )
    assert e.value.code == 0
    record = json.loads(capsys.readouterr().out)
    assert len(spark.session.sparkContext.statusTracker().getJobIdsForGroup()) >= jobs + 2  # both passes
    vocab = public_vocabulary(public_corpus, config.max_n, 1, config.vocab_max_items, tmp_path / "prior")
    stored = StoredReports(sorted((tmp_path / "c").rglob("*.parquet")), vocab)
    local = run(
        stored,
        vocab,
        ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce"),
        PublicCaps(W=config.max_items_per_report, C=config.item_clamp),
        engine=LOCAL,
    )
    assert record["gamma"] == local.gamma > 0 and int(record["n_reports"]) == local.n_reports == 90


def test_engine_settings_are_checked():
    from lac.curator.service.config import CuratorConfig

    with pytest.raises(ValueError, match="spark_master"):
        CuratorConfig(engine="spark")
    with pytest.raises(ValueError, match="engine"):
        CuratorConfig(engine="dask")
    with pytest.raises(ValueError, match="release_workers"):
        CuratorConfig(release_workers=0)


def test_without_pyspark_the_error_names_the_extra(tmp_path, public_corpus):
    """One line on stderr naming the install command, exit code 2 (pyspark made unimportable)."""
    code = "import sys; sys.modules['pyspark'] = None; from lac.common.cli import main; main(sys.argv[1:])"
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "curator",
            "serve",
            "--engine",
            "spark",
            "--spark-master",
            "local[1]",
            "--state-dir",
            str(tmp_path / "c"),
            "--public-corpus",
            str(public_corpus),
            "--vocab-min-count",
            "1",
            "--insecure",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in p.stderr.splitlines() if "pip install 'lac-curator[spark]'" in ln]
    assert p.returncode == 2 and len(lines) == 1, p.stderr


@pytest.mark.slow
def test_ingest_on_spark_stores_what_one_process_stores(
    spark, start_curator, curator_public_key, public_corpus, tmp_path
):
    """ingest_engine = spark (chunks of 64 reports, so several per batch): the same replies, reject
    counts, quarantine rows and segment bytes as single-node ingest, for batches with every kind of
    bad report and replays."""
    seal = lambda c: envelope.seal(c, curator_public_key)  # noqa: E731
    envelope.generate_key(tmp_path / "other-keys")
    other_key = envelope.CuratorKeyRing.load(tmp_path / "other-keys").public_key()
    text = sentences(public_corpus.read_text())
    rng = np.random.default_rng(7)
    first, _, _ = mixed_batch(text, seal, lambda c: envelope.seal(c, other_key), rng, 300)
    second = [seal(c) for c in good_reports(text, rng, 250)] + first[:5]  # ids replayed from the first batch
    outcome = {}
    for kind in ("local", "spark"):
        cur = start_curator(state_dir=tmp_path / kind, ingest_workers=1, ingest_engine=kind, spark_master="local[2]")
        if kind == "spark":
            assert isinstance(cur.curator.ingest, SparkIngest) and cur.curator.ingest.session is spark.session
            cur.curator.ingest.chunk_reports = 64
        with grpc.insecure_channel(cur.address) as ch:
            stub = curator_pb2_grpc.CuratorIngestStub(ch)
            replies = [
                stub.IngestBatch(
                    curator_pb2.IngestBatchRequest(batch_id=b, reports=p, privacy=batch_privacy(len(p))), timeout=60
                )
                for b, p in (("b1", first), ("b2", second))
            ]
            status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        cur.stop()
        store = CuratorStore(tmp_path / kind)
        outcome[kind] = (
            [(r.accepted, r.rejected) for r in replies],
            dict(status.rejects),
            store.quarantine(),
            [p.read_bytes() for p in store.segment_paths()],
        )
        store.close()
    assert outcome["spark"] == outcome["local"]
    assert outcome["spark"][0] == [(300, 9), (250, 5)] and len(outcome["spark"][3]) == 2


def test_key_shipping_needs_authentication_and_encryption():
    """Issue 23.20: which sessions may receive the curator's private keys (ingest on Spark)."""
    from lac.curator.ingest.spark import KEY_SAFE_CONF, key_shipping_gaps

    assert key_shipping_gaps("local[2]", {}) == [] and key_shipping_gaps("local", {}) == []
    gaps = key_shipping_gaps("spark://spark-master:7077", {"spark.authenticate": "true"})
    assert [g.split("=")[0] for g in gaps] == ["spark.network.crypto.enabled", "spark.io.encryption.enabled"]
    assert key_shipping_gaps("yarn", dict.fromkeys(KEY_SAFE_CONF, "TRUE")) == []
    assert len(key_shipping_gaps("k8s://https://host:443", {})) == 3
    assert len(key_shipping_gaps("sc://host:15002", {})) == 2
    assert key_shipping_gaps("sc://host:15002/;use_ssl=true", {}) == [
        "token=... in the sc:// URL (the Connect server authenticates the curator)"
    ]
    assert key_shipping_gaps("sc://host:15002/;use_ssl=true;token=secret", {}) == []


@pytest.mark.slow
def test_ingest_on_spark_refuses_a_session_without_tls_or_token(spark, connect):
    """A real Spark Connect session over plaintext gRPC with no token: the keys would travel in the clear."""
    for master in (spark.connect_url, None):
        with pytest.raises(ValueError, match="PRIVATE keys") as e:
            SparkIngest(object(), connect.session, master=master)
        assert "use_ssl=true" in str(e.value) and "token=" in str(e.value)
    assert SparkIngest(object(), spark.session).session is spark.session  # local[2]: this machine's processes
