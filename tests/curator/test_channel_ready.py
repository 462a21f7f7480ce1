"""The local channel is never in the way (issue 33): while a curator samples it, a release that needs it
answers at once with UNAVAILABLE, its progress, the time left and a retry-after; the preview and the metrics
say how far it is; `lac curator channel build` fills the cache that every curator pointed at it reads
without sampling."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest
from lac_testkit import DEADLINE, PROMPT, content, metrics_port, run_lac, samples, scrape, wait_until

from lac.analyst.client import ChannelNotReady, error_from_rpc, new_request_id, release_with_retries
from lac.common import envelope
from lac.common.errors import ERROR_REASON_KEY, ErrorReason
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.service.channel import ChannelProgress

TEXTS = [["the", "dog", "sleeps", "in", "the", "sun"], ["the", "fox", "is", "a", "small", "animal"]] * 4


class GatedProgress(ChannelProgress):
    """Holds the channel's sampling after its first pass until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def update(self, done: int, total: int) -> None:
        super().update(done, total)
        if done > 0:
            assert self.gate.wait(DEADLINE * 4), "the test never released the channel's sampling"


class CountingProgress(ChannelProgress):
    """Counts the sampling's progress reports (none: nothing was sampled)."""

    def __init__(self) -> None:
        super().__init__()
        self.reports = 0

    def update(self, done: int, total: int) -> None:
        self.reports += 1
        super().update(done, total)


def _trailing(err: grpc.RpcError) -> dict[str, str]:
    return dict(err.trailing_metadata() or ())


@pytest.mark.slow  # samples a small channel over GloVe 50k (10-20 s)
def test_a_release_while_the_channel_is_sampled_answers_unavailable_at_once(start_curator, curator_public_key, caplog):
    progress = GatedProgress()
    cur = start_curator(channel_progress=progress, wait_channel=False, metrics_port=0)
    try:
        wait_until(lambda: progress.phase == "sampling" and progress.done > 0, timeout=DEADLINE)
        with grpc.insecure_channel(cur.address) as ch:
            reports = [envelope.seal(content(t), curator_public_key) for t in TEXTS]
            ingest = curator_pb2_grpc.CuratorIngestStub(ch)
            ingest.IngestBatch(curator_pb2.IngestBatchRequest(batch_id="b1", reports=reports), timeout=DEADLINE)
            stub = curator_pb2_grpc.CuratorStub(ch)
            request = curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6, request_id=new_request_id())
            t = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                stub.Release(request, timeout=DEADLINE)
            assert time.monotonic() - t < PROMPT  # answered at once, not after the sampling
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            details, trailing = err.value.details(), _trailing(err.value)
            assert "sampling the deployment's local channel" in details and "% of" in details
            assert "s left" in details and "nothing was spent" in details
            assert trailing[ERROR_REASON_KEY] == ErrorReason.CHANNEL_NOT_READY
            assert int(trailing["retry-after-seconds"]) >= 1
            # nothing was spent, and a mechanism without the channel is not held up
            assert stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=DEADLINE).releases == 0
            laplace = stub.Release(curator_pb2.ReleaseRequest(epsilon=1, mechanism="laplace"), timeout=DEADLINE)
            assert laplace.differentially_private
            # the preview says how far the sampling is
            preview = stub.PreviewRelease(curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6), timeout=DEADLINE)
            assert preview.HasField("channel_progress") and 0 <= preview.channel_progress < 1
            assert "sampling the deployment's local channel" in preview.channel_status
            assert "a release answers UNAVAILABLE until then" in preview.statement
            # ... and so do the metrics
            metrics = samples(scrape(metrics_port(cur))[0])
            assert metrics[("lac_curator_channel_ready", frozenset())] == 0
            assert 0 <= metrics[("lac_curator_channel_progress", frozenset())] < 1
            # the analyst's client: with no time to wait, a typed error saying how long to wait ...
            with pytest.raises(grpc.RpcError) as err:
                release_with_retries(stub.Release, request, DEADLINE, sleep=pytest.fail, channel_wait=0)
            typed = error_from_rpc(err.value)
            assert isinstance(typed, ChannelNotReady) and typed.retry_after is not None and typed.retry_after >= 1
            assert "retry in" in typed.details
            # ... and by default it waits the server's retry-after, saying why (the channel is let go meanwhile)
            waits: list[float] = []

            def sleep(seconds: float) -> None:
                waits.append(seconds)
                progress.gate.set()
                time.sleep(0.2)

            with caplog.at_level(logging.WARNING, logger="lac.analyst.transport"):
                r = release_with_retries(stub.Release, request, DEADLINE * 4, sleep=sleep)
            assert waits and waits[0] >= 1
            assert "sampling the deployment's local channel" in caplog.text and "asking again in" in caplog.text
            assert "deconvolved with the public local channel" in r.statement and "draws per word" in r.statement
            assert stub.Release(request, timeout=DEADLINE).release_id == r.release_id  # the same request: made once
            preview = stub.PreviewRelease(curator_pb2.ReleaseRequest(epsilon=1, delta=1e-6), timeout=DEADLINE)
            assert not preview.HasField("channel_progress") and preview.channel_status == ""
            metrics = samples(scrape(metrics_port(cur))[0])
            assert metrics[("lac_curator_channel_ready", frozenset())] == 1
            assert metrics[("lac_curator_channel_progress", frozenset())] == 1
    finally:
        progress.gate.set()


def test_channel_progress_states_its_fraction_and_time_left():
    """Before the first pass there is no rate, so no time left, and the answer's retry-after falls back to the
    build phase's (never 0); while sampling the time left is the rate so far's."""
    p = ChannelProgress()
    assert p.seconds_left() is None and p.unavailable().retry_after >= 1
    p.update(0, 100)  # the start (sample_channel reports it before its first pass)
    assert p.phase == "sampling" and p.seconds_left() is None
    time.sleep(0.01)
    p.update(10, 100)
    assert p.phase == "sampling" and p.fraction == pytest.approx(0.1)
    left = p.seconds_left()
    assert left is not None and left > 0
    p.update(100, 100)
    assert p.phase == "building" and p.seconds_left() is None
    p.finish(True)
    assert p.ready and p.fraction == 1


@pytest.mark.slow  # samples a small channel over GloVe 50k twice (20-40 s)
def test_channel_build_then_every_curator_reads_it_and_never_samples(start_curator, public_corpus, tmp_path, capsys):
    cache = tmp_path / "channels"
    flags = ["--state-dir", str(tmp_path / "built"), "--channel-cache-dir", str(cache)]
    flags += ["--public-corpus", str(public_corpus), "--vocab-min-count", "1"]
    code, out, _ = run_lac(capsys, "curator", "channel", "build", *flags)
    assert code == 0 and "sampled, ready after" in out and f"--channel-cache-dir {cache}" in out
    assert "% of" in out  # the progress was printed
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == ["channel", "ngram"]
    code, out, _ = run_lac(capsys, "curator", "channel", "build", *flags)
    assert code == 0 and "already built there (nothing sampled)" in out
    for replica in range(2):  # two curators on their own state directories, one channel cache
        progress = CountingProgress()
        start_curator(state_dir=tmp_path / f"replica{replica}", channel_cache_dir=cache, channel_progress=progress)
        assert progress.ready and not progress.sampled and progress.reports == 0
    # the test can fail: a curator on an empty cache samples
    progress = CountingProgress()
    start_curator(state_dir=tmp_path / "fresh", channel_cache_dir=tmp_path / "empty", channel_progress=progress)
    assert progress.ready and progress.sampled and progress.reports > 0


def test_channel_build_of_a_deployment_without_a_channel_model_says_so(public_corpus, tmp_path, capsys):
    flags = ["--state-dir", str(tmp_path / "s"), "--channel-cache-dir", str(tmp_path / "c")]
    flags += ["--public-corpus", str(public_corpus), "--vocab-min-count", "1", "--embedding", "nosuch/1"]
    code, out, err = run_lac(capsys, "curator", "channel", "build", *flags)
    assert code != 0 and "error: no local channel for this deployment" in err and "nosuch/1" in err
    assert "Traceback" not in out + err and not (tmp_path / "c").exists()
