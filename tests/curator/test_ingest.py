"""All-core ingest (lac.curator.ingest.chunks): the same accepted reports, quarantine and segment bytes on
one process or a pool of workers, warm workers, and none left by a killed curator (workers killed and
hanging: test_ingest_pool.py)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from curator_testkit import Stubs, all_end, batch, descendants, serve_curator
from lac_testkit import DEPLOYMENT, batch_privacy, content, wait_until

from lac.common import envelope
from lac.common.text import sentences
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2
from lac.curator.base.ngrams import report_items
from lac.curator.ingest.chunks import IngestPool, OpenedChunk, count_chunk, merge_counts, open_chunk
from lac.curator.service.config import CuratorConfig
from lac.curator.store import segments as seg
from lac.curator.store.store import CuratorStore

WINDOW = DEPLOYMENT.window(time.time())


@pytest.fixture
def text(public_corpus):
    """The sentences of the tests' small public text."""
    return sentences(public_corpus.read_text())


@pytest.mark.parametrize("n_words,max_words,trials", [(17, 8, 200), (3000, 30, 4)])
def test_merge_counts_equals_counting_at_once(n_words, max_words, trials):
    """Chunks counted apart and merged over any kept subset give exactly ``report_items`` of the
    kept reports' sentences (same dictionary order, ids, counts). 3000 words: keys too large to
    pack with their positions, the other sort."""
    rng = np.random.default_rng(1)
    words = np.array([f"w{i}" for i in range(n_words)])
    for trial in range(trials):
        n = int(rng.integers(0, 40)) if n_words < 100 else 300
        reps = [
            [list(rng.choice(words, size=rng.integers(0, max_words))) for _ in range(rng.integers(0, 4))]
            for _ in range(n)
        ]
        max_n = int(rng.integers(1, 5)) if n_words < 100 else 5
        cuts = sorted(rng.choice(np.arange(n + 1), size=int(rng.integers(0, 5))).tolist())
        chunks = [
            count_chunk(OpenedChunk([b""] * (b - a), reps[a:b], []), max_n)
            for a, b in itertools.pairwise([0, *cuts, n])
        ]
        keep = np.flatnonzero(rng.random(n) < rng.random()).tolist() if trial % 3 else list(range(n))
        got, want = merge_counts(chunks, keep), report_items([reps[i] for i in keep], max_n)
        assert got.items.to_pylist() == list(want.items)
        for f in ("indptr", "item_ids", "counts"):
            assert getattr(got, f).dtype == getattr(want, f).dtype and np.array_equal(getattr(got, f), getattr(want, f))


def good_reports(text, rng, n):
    """Real sentences (1-3 per report, at most 40 words), fresh report ids."""
    return [content(*(text[i] for i in rng.choice(len(text), size=rng.integers(1, 4)))) for _ in range(n)]


def mixed_batch(text, seal, other_seal, rng, n_good):
    """Good sealed reports with every kind of bad one spread through them, and replays: two
    copies of a report id within the batch (across chunks)."""
    good = good_reports(text, rng, n_good)
    sealed = [seal(c) for c in good]
    tampered = bytearray(sealed[0].data)
    tampered[100] ^= 1
    bad = [
        reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id=sealed[0].key_id, data=bytes(tampered)),
        other_seal(good[1]),  # sealed to another curator's key
        envelope.seal_insecure(good[2]),  # plaintext, not allowed
        seal(content(["bad token"])),
        seal(content(["<s>", "x"])),
        seal(content(["the"], epsilon=16.0)),
        seal(content(["the"] * 41)),
        reports_pb2.SealedPayload(),
    ]
    payloads = list(sealed)
    for i, b in enumerate(bad):
        payloads.insert(7 + 29 * i, b)
    payloads.append(seal(good[3]))  # the same report id again, resealed
    return payloads, good, bad  # the second copy of good[3] is dropped as a replay


@pytest.fixture
def other_seal(tmp_path):
    envelope.generate_key(tmp_path / "other-keys")
    key = envelope.CuratorKeyRing.load(tmp_path / "other-keys").public_key()
    return lambda c: envelope.seal(c, key)


def ingest(ch, batch_id, payloads, timeout=60):
    return curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
        curator_pb2.IngestBatchRequest(
            batch_id=batch_id, reports=payloads, privacy=batch_privacy(len(payloads), window=WINDOW)
        ),
        timeout=timeout,
    )


def test_pooled_ingest_stores_what_one_process_stores(start_curator, curator_public_key, other_seal, text, tmp_path):
    """ingest_workers = 1 and = 2: the same replies, reject counts, quarantine rows and segment
    bytes, equal to counting the accepted reports' sentences at once; the pool really ran."""
    seal = lambda c: envelope.seal(c, curator_public_key)  # noqa: E731
    rng = np.random.default_rng(7)
    first, kept1, bad = mixed_batch(text, seal, other_seal, rng, 300)
    second = [seal(c) for c in good_reports(text, rng, 250)] + first[:5]  # ids replayed from the first batch
    outcome = {}
    for workers in (1, 2):
        cur = start_curator(state_dir=tmp_path / f"w{workers}", ingest_workers=workers)
        with grpc.insecure_channel(cur.address) as ch:
            replies = [ingest(ch, "b1", first), ingest(ch, "b2", second)]
            status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5)
        assert bool(cur.curator.ingest.worker_pids()) == (workers > 1)
        cur.stop()
        store = CuratorStore(tmp_path / f"w{workers}")
        outcome[workers] = (
            [(r.accepted, r.rejected) for r in replies],
            dict(status.rejects),
            store.quarantine(),
            [p.read_bytes() for p in store.segment_paths()],
        )
        store.close()
    assert outcome[1] == outcome[2]
    replies, rejects, quarantine, segments = outcome[2]
    assert replies == [(300, 9), (250, 5)]
    assert rejects == {
        "decrypt_failed": 1,
        "unknown_key": 1,
        "plaintext_refused": 1,
        "invalid": 2,
        "epsilon_too_large": 1,
        "too_many_words": 1,
        "unsupported_encoding": 1,
        "replayed_report_id": 1 + 5,
    }
    unopened = (*bad[:3], bad[-1])  # an opened report's sealed bytes are not kept (store.OPENED)
    assert sorted(q[3] for q in quarantine) == sorted([b""] * 4 + [b.SerializeToString() for b in unopened])
    want = tmp_path / "want.parquet"
    seg.write(
        want,
        report_items([[list(s.tokens) for s in c.sentences] for c in kept1], 3),
        {"batch_id": "b1", "first_window": WINDOW, "last_window": WINDOW},
    )
    assert segments[0] == want.read_bytes()


def test_open_chunk_quarantines_what_is_not_a_sealed_payload(curator_key_dir, curator_public_key):
    ring = envelope.CuratorKeyRing.load(curator_key_dir)
    ctx = CuratorConfig().ingest_context(ring, 3)
    assert "keys" not in repr(ctx) and ring.private_material()[0][1].hex() not in repr(ctx)
    good = envelope.seal(content(["the", "dog"]), curator_public_key).SerializeToString()
    opened = open_chunk(ctx, [b"\xff\xff\xff", good])
    assert opened.sentences == [[["the", "dog"]]]
    (q,) = opened.quarantined
    assert (q.reason, q.sealed) == ("malformed", b"\xff\xff\xff") and "not a SealedPayload" in q.detail


def test_the_workers_start_with_the_curator_and_stay(start_curator, curator_public_key, text):
    """No batch waits for worker processes: the curator starts its pool with the server, and the same
    workers count every pooled batch; below ``min_pool_batch`` a batch is opened in process."""
    seal = lambda c: envelope.seal(c, curator_public_key)  # noqa: E731
    rng = np.random.default_rng(5)
    cur = start_curator(ingest_workers=2)
    pool = cur.curator.ingest
    wait_until(lambda: len(pool.worker_pids()) == 2)  # before any batch
    pids = set(pool.worker_pids())
    assert set(pool.start()) <= pids  # started already: no new process
    with grpc.insecure_channel(cur.address) as ch:
        for i in range(2):
            assert ingest(ch, f"b{i}", [seal(c) for c in good_reports(text, rng, 250)]).accepted == 250
    assert set(pool.worker_pids()) == pids
    assert pool.pooled(200) and not pool.pooled(199)
    with pytest.raises(ValueError, match="min_pool_batch"):
        IngestPool(pool.ctx, 2, min_pool_batch=0)
    one = IngestPool(pool.ctx, 1)
    assert one.start() == [] and one.worker_pids() == []


def test_a_killed_curator_takes_its_ingest_workers_forkserver_and_tracker_with_it(tmp_path, public_corpus):
    """SIGKILL of a real curator (as by the OOM killer) after a pooled batch: its ingest workers
    (which hold its private keys), the forkserver and the resource tracker all end within seconds."""
    cur = serve_curator(tmp_path / "run", tmp_path / "state", public_corpus, "--ingest-workers", "2")
    try:
        with Stubs(cur.address) as s:
            assert s.ingest.IngestBatch(batch(250), timeout=60).accepted == 250
        procs = descendants(cur.pid)
        assert len(procs) >= 4  # two workers, the forkserver, the resource tracker
    finally:
        cur.kill()
    assert all_end(procs) == set()


def test_a_killed_curator_takes_its_release_workers_with_it(tmp_path):
    """The release engine's worker processes (``LocalEngine`` with 2 workers), busy on their parts
    when their parent is SIGKILLed, end within seconds, and so do the forkserver and tracker."""
    script = (
        "import time, types\n"
        "from lac.curator.engines.local import LocalEngine\n"
        "parts = types.SimpleNamespace(parts=lambda: [120, 120], load=time.sleep)\n"
        "LocalEngine(2).fold(parts, repr, lambda acc, r: acc, None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while len(procs := descendants(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(procs) >= 4  # two workers, the forkserver, the resource tracker
    finally:
        proc.kill()
        proc.wait()
    assert all_end(procs) == set()


def test_a_batch_is_scanned_as_protobuf_parses_it():
    """``serde.ingest_batch`` (the curator's one scan of a batch's bytes) against the generated parser:
    the same id, report bytes and statement for real batches with unknown fields, repeated scalars and a
    statement split in two on the wire; malformed bytes and too many reports are INVALID_ARGUMENT."""
    from lac.common.errors import InvalidArgument
    from lac.common.rpc import count_field, fields
    from lac.curator.service.serde import batch_statement, ingest_batch

    for n in (0, 1, 7, 300):
        request = batch(n)
        raw = request.SerializeToString()
        got = ingest_batch(raw, max_reports=300)
        assert got.batch_id == request.batch_id and got.privacy == batch_statement(request.privacy)
        assert got.payloads == [p.SerializeToString() for p in request.reports]
        assert count_field(raw, 2, 1000) == n and sum(f[0] == 2 for f in fields(raw)) == n
    request = batch(3)
    privacy = request.privacy.SerializeToString()
    half = [end for _, _, _, end in fields(privacy)][3]  # a message may arrive in pieces: the parser merges them
    first, second = reports_pb2.BatchPrivacy.FromString(privacy[:half]), privacy[half:]
    raw = (
        curator_pb2.IngestBatchRequest(batch_id="old-id").SerializeToString()
        + request.SerializeToString()  # its batch_id, the last one, wins
        + b"\x08\x05"  # an unknown varint field
        + b"\x3d\x01\x02\x03\x04"  # an unknown fixed32 field
        + curator_pb2.IngestBatchRequest(privacy=first).SerializeToString()
        + b"\x1a"
        + bytes([len(second)])
        + second  # field 3, the statement's other fields
        + b"\x9a\x06\x07unknown"  # an unknown length-delimited field (99)
    )
    parsed = curator_pb2.IngestBatchRequest.FromString(raw)
    got = ingest_batch(raw, max_reports=3)
    assert (got.batch_id, got.privacy) == (parsed.batch_id, batch_statement(parsed.privacy))
    assert parsed.privacy == request.privacy and got.privacy.encoded == request.privacy.SerializeToString()
    assert got.payloads == [p.SerializeToString() for p in parsed.reports]
    assert ingest_batch(b"", max_reports=1).privacy is None
    for bad in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x0b", b"\x12\x02\x0a", b"\x0a\x02\xff\xfe"):
        with pytest.raises(InvalidArgument, match="malformed IngestBatchRequest"):
            ingest_batch(bad, max_reports=10)
    with pytest.raises(InvalidArgument, match=r"more than 2 reports in one batch; at most 2 \(max_reports_per_batch\)"):
        ingest_batch(batch(3).SerializeToString(), max_reports=2)


def test_a_report_that_is_not_a_sealed_payload_is_quarantined_not_the_batch(start_curator):
    """Over RPC: the batch's other reports are stored (the batch is not refused, so a shuffler is not left
    retrying it forever); the bad one is quarantined as malformed."""
    cur = start_curator(allow_plaintext_payloads=True)
    request = batch(5, batch_id="with-a-bad-report")
    raw = request.SerializeToString() + b"\x12\x03\xff\xff\xff"  # field 2, three bytes
    with grpc.insecure_channel(cur.address) as ch:
        call = ch.unary_unary(
            "/lac.v1.CuratorIngest/IngestBatch",
            request_serializer=None,
            response_deserializer=curator_pb2.IngestBatchResponse.FromString,
        )
        reply = call(raw, timeout=60)
        assert (reply.accepted, reply.rejected) == (5, 1)
        status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)
        assert status.rejects["malformed"] == 1
