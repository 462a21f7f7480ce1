"""Helpers of the curator's process-level tests: a real ``lac curator serve`` subprocess and batches
of real (plaintext) reports sent to it with IngestBatch; the handlers over a state without gRPC (``on_state``); and
the coverage of a release's error bars by simulation."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
from lac_testkit import ServeProc, batch_privacy, content

from lac.common import envelope
from lac.common.privacy import Budget
from lac.common.v1 import curator_pb2, curator_pb2_grpc
from lac.curator.base.ngrams import NgramVocabulary, ReportItems, report_items
from lac.curator.base.prior import public_vocabulary
from lac.curator.ingest.chunks import IngestBatch
from lac.curator.release.building import StoredReports
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap, held_post_process, interval, posterior_errors
from lac.curator.release.posterior import PosteriorParams, WeightedTotals, posterior_release
from lac.curator.service import lifecycle
from lac.curator.service.config import CuratorConfig
from lac.curator.service.serde import batch_statement
from lac.curator.service.state import CuratorState
from lac.curator.store import segments
from lac.curator.store.store import CuratorStore

T = TypeVar("T")

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "sleeps",
    "in",
    "sun",
    "a",
    "is",
    "small",
    "animal",
    "star",
    "and",
    "are",
    "friends",
    "people",
    "like",
    "to",
    "walk",
    "park",
    "green",
    "spring",
    "we",
    "every",
    "day",
    "it",
    "good",
    "weather",
    "nice",
    "today",
    "i",
    "think",
    "will",
    "be",
    "tomorrow",
)
CURATOR_SERVICES = ("", "lac.v1.CuratorIngest", "lac.v1.Curator")


def serve_curator(
    workdir, state, public_corpus, *extra: str, timeout: float = 90.0, env: dict | None = None
) -> ServeProc:
    """A real ``lac curator serve`` (plaintext gRPC and payloads, every caller every role: tests only), with the
    environment ``env`` if given."""
    return ServeProc(
        [
            "--state-dir",
            str(state),
            "--public-corpus",
            str(public_corpus),
            "--vocab-min-count",
            "1",
            "--insecure",
            "--allow-plaintext-payloads",
            "--min-signal-share",
            "0",
            "--ingest-workers",
            "1",
            *extra,
        ],
        workdir,
        timeout=timeout,
        service="curator",
        env=env,
    )


def batch(n: int, rng: random.Random | None = None, batch_id: str | None = None) -> curator_pb2.IngestBatchRequest:
    """A batch of ``n`` plaintext reports of random words from ``WORDS``, as a shuffler sends it."""
    rng = rng or random.Random()
    reports = [
        envelope.seal_insecure(content([rng.choice(WORDS) for _ in range(rng.randint(3, 12))])) for _ in range(n)
    ]
    return curator_pb2.IngestBatchRequest(
        batch_id=batch_id or "b-" + os.urandom(8).hex(), reports=reports, privacy=batch_privacy(n)
    )


def ingest_batch(sentences: list[list[str]], batch_id: str | None = None, window: int | None = None) -> IngestBatch:
    """A batch as the servicer hands it to the ingest handler: one plaintext report per sentence, of distinct clients
    in ``window`` (the current one by default)."""
    payloads = [envelope.seal_insecure(content(s)).SerializeToString() for s in sentences]
    statement = batch_statement(batch_privacy(len(payloads), window=window))
    return IngestBatch(batch_id or "b-" + os.urandom(8).hex(), payloads, statement)


def on_state(tmp_path: Path, public_corpus: Path, run: Callable[[CuratorState], Awaitable[T]], **overrides) -> T:
    """``await run(state)`` on a curator's state over ``tmp_path / "state"`` (``lifecycle.open_state`` with a tiny
    public prior, plaintext reports, no local channel, seeded noise; started before and stopped after): the handlers
    driven without gRPC, over the real SQLite store."""
    overrides = {
        "allow_plaintext_payloads": True,
        "clean_estimate": False,
        "min_signal_share": 0.0,
        "ingest_workers": 1,
        **overrides,
    }
    config = CuratorConfig(state_dir=tmp_path / "state", public_corpus=public_corpus, vocab_min_count=1, **overrides)
    vocab = public_vocabulary(
        config.public_corpus, config.max_n, config.vocab_min_count, config.vocab_max_items, config.state_dir / "prior"
    )

    async def main() -> T:
        state = lifecycle.open_state(config, vocab, rng=np.random.default_rng(7))
        lifecycle.start(state)
        try:
            return await run(state)
        finally:
            await lifecycle.stop(state)

    return asyncio.run(main())


class Stubs:
    """Both curator services over one plaintext channel."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.ingest = curator_pb2_grpc.CuratorIngestStub(self.channel)
        self.query = curator_pb2_grpc.CuratorStub(self.channel)

    def status(self) -> curator_pb2.CuratorStatus:
        return self.query.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)

    def spent(self) -> dict[int, tuple[float, float]]:
        """(ε, δ) spent per window."""
        return {
            w.window: (w.spent_epsilon, w.spent_delta)
            for w in self.query.GetBudget(curator_pb2.BudgetRequest(), timeout=10).windows
        }

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Stubs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SEGMENT_WORDS = (
    "the",
    "a",
    "dog",
    "cat",
    "sun",
    "star",
    "walks",
    "sleeps",
    "in",
    "on",
    "is",
    "was",
    "big",
    "small",
    "red",
    "old",
)


def random_stored(root, rng, n_segments: int, reports_in_segment) -> StoredReports:
    """``n_segments`` segments of random reports under ``root`` (some longer than a release's W;
    ``reports_in_segment(k)`` is the (low, high) range of segment k's report count), and a public
    vocabulary covering part of their n-grams and part of their words (the others read as <unk>)."""
    public = [list(rng.choice(SEGMENT_WORDS[:12], size=int(rng.integers(3, 9)))) for _ in range(200)]
    vocab = NgramVocabulary.from_sentences(public, max_n=3, min_count=2, unknown_words=True)
    paths = []
    for k in range(n_segments):
        reports = [
            [list(rng.choice(SEGMENT_WORDS, size=int(rng.integers(0, 30)))) for _ in range(int(rng.integers(0, 3)))]
            for _ in range(int(rng.integers(*reports_in_segment(k))))
        ]
        path = root / f"window={k}" / f"b{k}.parquet"
        segments.write(path, report_items(reports, 3), {"batch_id": f"b{k}"})
        paths.append(path)
    return StoredReports(paths, vocab)


# -- processes (from /proc) --------------------------------------------------------------------------


def _parents() -> dict[int, list[int]]:
    """Every live process's children (from /proc; zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from /proc)."""
    children = _parents()
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def ingest_processes(curator: int) -> tuple[int | None, int | None, list[int]]:
    """(forkserver, resource tracker, ingest workers) of a curator process: its multiprocessing helpers are
    its children, named by their command lines, and its ingest workers the forkserver's children."""
    children = _parents()
    forkserver = tracker = None
    for pid in children.get(curator, []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmdline:
            forkserver = pid
        elif b"multiprocessing.resource_tracker" in cmdline:
            tracker = pid
    return forkserver, tracker, sorted(children.get(forkserver, [])) if forkserver else []


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def all_end(pids, timeout: float = 10.0) -> set[int]:
    """The pids still running after up to ``timeout`` seconds (then killed, not to outlive the test)."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


# --- coverage of error bars -----------------------------------------------------------------------------------

LEVEL = 0.9
MARGIN = 0.05  # nominal 90% must cover 85-95%


def normalised(counts: np.ndarray, orders: np.ndarray, within_order: bool) -> np.ndarray:
    """Counts as the release's probabilities: over all items, or within each item's order."""
    out = np.empty(counts.size)
    for n in np.unique(orders).tolist() if within_order else [None]:
        sel = slice(None) if n is None else orders == n
        out[sel] = counts[sel] / counts[sel].sum()
    return out


def coverage(center, sd, target, family: str = "normal", width: float = 1.0) -> float:
    """The share of items whose interval at ``LEVEL`` (its half-width scaled by ``width``) holds ``target``, to a
    relative 1e-9 (an item the noise cannot move has a zero-width interval at its target, up to rounding)."""
    low, high = interval(center, sd * width, family, LEVEL)
    tol = 1e-9 * target
    return float(np.mean((low - tol <= target) & (target <= high + tol)))


def covers_nominally(rates: list[float]) -> bool:
    """Whether the mean coverage over releases is within ``MARGIN`` of ``LEVEL``."""
    return abs(float(np.mean(rates)) - LEVEL) <= MARGIN


def posterior_coverage(
    y: np.ndarray, epsilon: float, releases: int, vocab: NgramVocabulary, channel: NgramChannel | None = None
) -> dict[str, list[float]]:
    """``releases`` releases of the fixed totals ``y`` over ``vocab`` with fresh DP noise through the real release
    path (the posterior, with ``channel`` if given), each with its bootstrap (``DRAWS`` draws); per release the coverage
    of the noise-free value (the same post-processing of ``y``, with what the release fitted held), on the joint
    scale and within the order, and that of half-width intervals."""
    rng = np.random.default_rng(2026)
    p = PosteriorParams(epsilon, 1e-6, discovery=False)
    rates: dict[str, list[float]] = {"joint": [], "order": [], "half": []}
    for r in range(releases):
        pr = posterior_release(WeightedTotals(y.copy()), vocab, p, rng, channel=channel)
        e = posterior_errors(
            pr.noisy_public, [], pr.found_noisy, pr.pseudo_counts, pr.fits, vocab, pr.sigma, pr.threshold, channel,
            Bootstrap(seed=r),
        )  # fmt: skip
        free = held_post_process(y[None], [], np.empty((1, 0)), pr.fits, vocab, pr.sigma, pr.threshold, channel)[0]
        joint, order = normalised(free, vocab.orders, False), normalised(free, vocab.orders, True)
        rates["joint"].append(coverage(e.center, e.sd, joint))
        rates["order"].append(coverage(e.order_center, e.order_sd, order))
        rates["half"].append(coverage(e.center, e.sd, joint, width=0.5))
    return rates


class Traffic:
    """A shuffler (batches of 30 reports) and an analyst (small releases with request ids) against one
    curator incarnation; a call cut off by the kill stays pending and is sent again to the next."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.sent: dict[str, int] = {}  # batch id -> reports (every batch ever sent)
        self.pending_batches: list[curator_pb2.IngestBatchRequest] = []
        self.pending_releases: list[str] = []
        self.requests: set[str] = set()  # every release request id ever sent
        self.n = 0

    def ingest(self, address: str, stop: threading.Event) -> None:
        with Stubs(address) as s:
            while not stop.is_set():
                request = self.pending_batches.pop(0) if self.pending_batches else batch(30, self.rng)
                self.sent[request.batch_id] = len(request.reports)
                try:
                    s.ingest.IngestBatch(request, timeout=10)
                except grpc.RpcError:
                    self.pending_batches.append(request)  # cut off: sent again after the restart
                    return

    def release(self, address: str, stop: threading.Event, started: threading.Event | None = None) -> None:
        with Stubs(address) as s:
            while not stop.is_set():
                if self.pending_releases:
                    rid = self.pending_releases.pop(0)
                else:
                    self.n += 1
                    rid = f"release-{self.n}"
                self.requests.add(rid)
                if started is not None:
                    started.set()
                try:
                    s.query.Release(
                        curator_pb2.ReleaseRequest(epsilon=0.01, delta=1e-8, force=True, request_id=rid), timeout=30
                    )
                except grpc.RpcError:
                    self.pending_releases.append(rid)
                    return

    def settle(self, address: str) -> None:
        """Send everything the last kill cut off, to the new incarnation (nothing may fail now)."""
        with Stubs(address) as s:
            while self.pending_batches:
                s.ingest.IngestBatch(self.pending_batches.pop(0), timeout=30)
            while self.pending_releases:
                rid = self.pending_releases.pop(0)
                s.query.Release(
                    curator_pb2.ReleaseRequest(epsilon=0.01, delta=1e-8, force=True, request_id=rid), timeout=60
                )


DAY = 86400.0
UNIT = {"window_seconds": DAY, "reports_per_window": 1, "period_seconds": 365 * DAY, "windows_per_period": 0}


def stored_items(keep) -> ReportItems:
    """``CuratorStore.add_batch``'s ``count`` for reports of one n-gram, "a", each."""
    return ReportItems(
        np.arange(len(keep) + 1, dtype=np.int64), np.zeros(len(keep), np.int32), np.ones(len(keep), np.int32), ("a",)
    )


def stored_release(store: CuratorStore, rid: str, request_id: str | None = None, spec: str = "{}", **kw) -> str:
    """``store.add_release`` of a small posterior release, charged (1, 0) to windows 3 and 4 unless ``kw`` says."""
    kw.setdefault("windows", [3, 4])
    kw.setdefault("charge", Budget(1.0, 0.0))
    kw.setdefault("limit", Budget(10.0, 0.0))
    return store.add_release(
        rid,
        json.dumps({"release_id": rid, "mechanism": "posterior", "differentially_private": True}).encode(),
        ("a", "b"),
        np.log([0.5, 0.5]),
        None,
        request_id=request_id,
        spec=spec,
        **kw,
    )


@contextmanager
def opened_stores(tmp_path, url: str, **defaults) -> Iterator[Callable[..., CuratorStore]]:
    """A factory of ``CuratorStore``s on the database ``url`` ("" for SQLite), the state directory
    ``tmp_path/state`` (or the name it is given) and ``defaults`` for its other arguments; each closed at the end."""
    opened: list[CuratorStore] = []

    def make(state: str = "state", **kw) -> CuratorStore:
        s = CuratorStore(tmp_path / state, store=url, **(defaults | kw))
        opened.append(s)
        return s

    try:
        yield make
    finally:
        for s in opened:
            s.close()
