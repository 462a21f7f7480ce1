"""The shuffler service: authenticate, validate and durably store reports (group commit),
release anonymised shuffled batches, deliver them to the curator until acknowledged.

All SQLite work runs on one dedicated thread; the asyncio loop only awaits it. Concurrent
Submit calls queue their reports; one commit task drains the whole queue into a single
fsync'd transaction and then acknowledges every call in it (group commit).

Delivery: up to ``forward_in_flight`` released batches are sent to the curator at once (so it counts
one while it stores another), each retried with its own back-off until acknowledged and marked
delivered only then; a batch is never in flight twice, and one sent again after a restart carries the
same id and bytes, which the curator stores once.

A batch the curator refuses for good (``DEAD_LETTER_CODES``: its statement, windows or size are not what the
curator accepts, which no retry changes) is set aside as a *dead letter* at once, logged and counted, and never
blocks newer batches; the operator lists, retries or drops dead letters (``lac shuffler dead-letter``).
Other failures (the curator away, overloaded, its storage failing) are retried until acknowledged.

Before acknowledging anything, the shuffler checks its privacy unit (reports per window, window length, the cap
on windows per period) against the curator's published deployment, the one last fetched (kept across restarts)
or, at a first start, the first one fetched: while they differ, Submit answers UNAVAILABLE (reject
``deployment_mismatch``) and health is NOT_SERVING, since every batch of such reports would be refused.

Replicas over one PostgreSQL database (``store``): every replica takes any client's Submit (quotas, idempotency ids
and period caps are checked in the database's serializable transactions), and the one holding the release lease
(``lac.shuffler.lease``) releases, forwards and prunes; it reads the buffered counts from the database every
``CHECK_SECONDS``, and loses the lease, cancelling its deliveries, when its lease session ends. ``Flush`` on another
replica takes the lease if it is free, else answers UNAVAILABLE. A SQLite shuffler always holds it.

Storage failures (full disk, I/O errors, a commit that stalls, free space below
``min_free_disk_bytes``) never end a background task and never leave a call waiting: the first
one is logged once, counted (``lac_shuffler_storage_failures_total``), turns gRPC health to
NOT_SERVING, and from then on Submit answers UNAVAILABLE with ``retry-after-seconds`` at once.
``lac.common.storage.StorageGuard`` (shared with the curator) then test-writes the log with a
growing back-off; the first success (and the release then due, if any) restores SERVING. A
report is acknowledged only after its commit, so no acknowledged report is lost.

The privacy unit is one client over an accounting window: a client may store at most
``reports_per_window`` reports per window, and a batch takes at most one report per client
(``lac.shuffler.policy``). Each batch's amplification statement uses the report-level ε0 of the
curator's published deployment (``GetDeployment``), never an operator-typed number.

Sharded replicas (``shards``): each client belongs to one replica (``lac.shuffler.shards``); the
others refuse its reports before looking at them (``WrongShard``: FAILED_PRECONDITION naming the
right replica; counted as reject ``wrong_shard``), so a client's quota holds across replicas even
when it ignores its assignment. Batch ids are 128-bit values from the OS CSPRNG drawn per batch
(``ReportLog.release``), so two batches, of one replica or of two, share an id at the curator (which
de-duplicates by batch id) only with probability below n²/2^129 for n batches in all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import suppress

import grpc

from lac.common import envelope, retry, tls, tracing
from lac.common.deployment import Deployment, windows_in_period
from lac.common.envelope import PayloadRejected
from lac.common.errors import (
    ErrorReason,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RejectReason,
    ResourceExhausted,
    Unavailable,
)
from lac.common.privacy import Adjacency, Guarantee, Model, PrivacyUnit
from lac.common.rpc import parse_names
from lac.common.serde import deployment_from_proto, deployment_to_proto
from lac.common.server import Health
from lac.common.statelock import StateDirLock
from lac.common.storage import (
    STABLE_SECONDS,
    LowDiskSpace,
    StorageFailed,
    StorageGuard,
    StoreThread,
    storage_failure_reason,
)
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2
from lac.common.version import server_version
from lac.shuffler import amplification, wire
from lac.shuffler.auth import ShufflerAuth
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.lease import CHECK_SECONDS, CHECK_TIMEOUT_SECONDS
from lac.shuffler.metrics import ShufflerMetrics
from lac.shuffler.reportlog import LOG_FULL, OVER_PERIOD_CAP, OVER_QUOTA, ReportLog, StoredBatch
from lac.shuffler.shards import assign_shard, shards_digest
from lac.shuffler.shuffle import geometric

log = logging.getLogger(__name__)

MIN_IDEMPOTENCY_BYTES = 8
MAX_IDEMPOTENCY_BYTES = 64
MAX_KEY_ID_CHARS = 256
MAX_CROWD_ID_CHARS = 256
DEPLOYMENT_REFRESH_SECONDS = 300.0
RESTART_BACKOFF = retry.Backoff(initial=0.5, maximum=30.0)  # a failed background loop's restarts
FORWARD_RETRY_FIRST_SECONDS = 0.5  # the forwarder's first back-off ceiling (then doubling)
FORWARD_RETRY_MIN_SECONDS = 0.01  # the back-off ceiling used when forward_retry_max_seconds is not positive
SERVICE_NAME = shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].full_name
# The curator's refusals no retry changes: its checks of the batch itself (statement, windows, size).
DEAD_LETTER_CODES = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
MAX_DEAD_LETTER_IDS = 10_000  # batch ids named in one RetryDeadLetters/DropDeadLetters call
MAX_BATCH_ID_CHARS = 128  # as the curator's limit on a batch id
MISMATCH_RECHECK_SECONDS = 30.0  # how soon the curator's deployment is fetched again while it differs
_INGEST_METHOD = "/lac.v1.CuratorIngest/IngestBatch"


class WrongShard(FailedPrecondition):
    """A sharded replica's refusal: the calling client belongs to the replica at ``shard``."""

    def __init__(self, shard: str, this_replica: str):
        super().__init__(
            f"this client belongs to the shuffler replica at {shard}, not to {this_replica}: send the "
            f"same reports there (trailing metadata lac-shard); nothing was stored here",
            reason=RejectReason.WRONG_SHARD,
        )
        self.shard = shard


class ShardListMismatch(FailedPrecondition):
    """A replica's refusal of a Submit routed by another shard list (``digest``) than its own (``own``)."""

    def __init__(self, digest: str, own: str):
        super().__init__(
            f"this client was routed by a shard list (digest {digest[:16] or 'none: not sharded'}) other than "
            f"this replica's (digest {own[:16] or 'none: not sharded'}): the shuffler replicas' --shards differ, "
            f"tell their operator; nothing was stored here",
            reason=RejectReason.SHARD_LIST_MISMATCH,
        )
        self.own = own


def batch_guarantee(batch: StoredBatch, deployment: Deployment, config: ShufflerConfig) -> tuple[Guarantee, str]:
    """The central guarantee of one shuffled batch and the accounting method's name ("none": no amplification).

    Shuffling bounds hold for neighbouring batches that differ in one user's input (replace-one), and the
    report-level ε0 they amplify holds between reports of the same shape (``Adjacency.REPLACE_SAME_SHAPE``)."""
    eps0, delta = deployment.report_epsilon0, config.target_delta
    unit = PrivacyUnit.report(deployment.max_report_words)
    where = (
        f"each report is ε0-LDP with ε0 = {eps0:.6g} (L·ε·bound from the curator's deployment: "
        f"{deployment.max_report_words}·{deployment.epsilon_per_word:g}·{deployment.word_distance_bound:.6g})"
    )
    extra = []
    if config.crowd_threshold:
        extra.append(
            f"Crowd threshold k={config.crowd_threshold} applied (Prochlo-style; a data-dependent filter "
            f"with no DP claim of its own)."
        )
    if config.subsample_q < 1:
        extra.append(
            f"Reports were Poisson sub-sampled at q={config.subsample_q:g} (secret sample) before "
            f"shuffling; the ε above does not count that in. "
            + amplification.subsampling_statement(eps0, config.subsample_q)
        )
    if not batch.distinct_clients:
        return Guarantee(
            Model.SHUFFLED,
            eps0,
            0.0,
            unit,
            Adjacency.REPLACE_SAME_SHAPE,
            "shuffling without client authentication",
            details=(
                "No amplification: client authentication is off (auth none), so the reports are not known "
                f"to come from distinct clients; only the local guarantee holds: {where}.",
                *extra,
            ),
        ), "none"
    r = amplification.shuffle_epsilon(eps0, batch.n, delta)
    assumptions = (
        f"at most one report per client in the batch (enforced: quota {config.reports_per_window} per "
        f"{config.window_seconds:g} s window, one report per client per batch)",
    )
    if not r.amplified:
        return Guarantee(
            Model.SHUFFLED,
            eps0,
            0.0,
            unit,
            Adjacency.REPLACE_SAME_SHAPE,
            f"uniform shuffle of {batch.n} reports",
            details=(
                f"No amplification: {where}, and at n = {batch.n}, δ = {delta:.3g} the shuffle "
                f"accountant (lac.shuffler.amplification, method {r.method}) gives nothing below "
                f"it.",
                *extra,
            ),
            assumptions=assumptions,
        ), "none"
    return Guarantee(
        Model.SHUFFLED,
        r.epsilon,
        delta,
        unit,
        Adjacency.REPLACE_SAME_SHAPE,
        f"uniform shuffle of {batch.n} reports of distinct clients",
        details=(
            f"{where}; the shuffle accountant (lac.shuffler.amplification, method {r.method}) "
            f"bounds the batch's central ε, rounded up.",
            *extra,
        ),
        assumptions=assumptions,
    ), r.method


def _reap(sending: dict[str, asyncio.Task]) -> None:
    """Forget the deliveries that ended; raise the error of one that failed (the forwarder then restarts)."""
    for batch_id, task in list(sending.items()):
        if task.done():
            del sending[batch_id]
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc


class Shuffler:
    """Library object behind the gRPC servicer (also usable directly in tests)."""

    def __init__(self, config: ShufflerConfig):
        self.config = config
        self._period = windows_in_period(config.period_days * 86400.0, config.window_seconds)  # windows per period
        self._state_lock = StateDirLock(config.state_dir, "shuffler")  # one writer per state directory
        self._curator_tls = tls.client_tls(
            config.curator_ca,
            config.curator_cert or config.tls_cert,
            config.curator_key or config.tls_key,
            insecure=config.insecure,
            name="shuffler -> curator",
        )
        self.auth = ShufflerAuth(
            config.tokens_path,
            operators=parse_names(config.operator_identities),
            clients=parse_names(config.client_identities),
            client_auth=config.auth == "token",
            insecure=config.insecure,
        )
        if not self.auth.enabled:
            log.warning(
                "CLIENT AUTHENTICATION DISABLED (auth=none): anyone who can reach this port may submit, "
                "there is no per-client quota and batches carry no distinct-client guarantee. Local demos "
                "and tests only."
            )
        self._log = ReportLog(config.state_dir, config.store)
        self.store_id = self._log.store_id
        self.lease = self._log.lease  # this replica releases and forwards only while it holds it
        self._lease_lock = asyncio.Lock()
        self._deliveries: dict[str, asyncio.Task] = {}  # batch id -> its delivery, while this replica holds the lease
        self._wake_forwarder = asyncio.Event()
        self._pending: list = []  # (items, client key, future, arrival time, payload bytes) per Submit
        self._pending_bytes = 0
        self._wake_committer = asyncio.Event()
        self.health = Health([SERVICE_NAME])
        self.storage = StorageGuard(
            "report log",
            "Submit answers UNAVAILABLE and health is NOT_SERVING; acknowledged reports are kept",
            probe=self._probe,
            on_change=self._storage_changed,
            check_space=lambda: self._store.raw(self._check_space),
            advice="the reports may or may not be stored: retry later with the same idempotency ids",
            stall_seconds=config.commit_timeout_seconds,
            stall_setting="commit_timeout_seconds",
        )
        self._store = StoreThread("reportlog", self.storage)
        self.disk_free_bytes: int | None = None
        self._tasks: list[asyncio.Task] = []
        self._threshold = self._draw_threshold()
        self._next_threshold = self._draw_threshold()  # the reserve with keep_reserve
        self._window = self.window()
        cached = self._log.get_meta("deployment")  # the last one fetched, so a restart knows it at once
        self._deployment: Deployment | None = (
            deployment_from_proto(reports_pb2.Deployment.FromString(cached)) if cached else None
        )
        self._deployment_at = 0.0
        self.mismatch = ""  # why this shuffler's privacy unit is not the curator's ("" while they agree)
        if self._deployment is not None:
            self._note_mismatch(self._deployment)
        self.forward_failures = 0
        self.metrics = ShufflerMetrics(self)  # served at metrics_host:metrics_port once started (operator only)
        self.note = ""
        self.shards = config.shard_list
        self.shards_digest = shards_digest(self.shards)
        self._note_shard_change()

    # ------------------------------------------------------------------ shards

    def _note_shard_change(self) -> None:
        """Log the shard topology; warn when it differs from the one this state directory last served
        with and applies at once (a client that moves mid-window gets a fresh quota on its new replica)."""
        cfg = self.config
        current = {
            "shards": sorted(self.shards),
            "shard_name": cfg.shard_name,
            "effective_window": cfg.shards_effective_window,
        }
        stored = self._log.get_meta("shards")
        previous = json.loads(stored) if stored else None
        if self.shards:
            log.info(
                "shard %s of %d replicas (%s), applying from window %d (now %d)",
                cfg.shard_name,
                len(self.shards),
                ", ".join(self.shards),
                cfg.shards_effective_window,
                self._window,
            )
        if (
            previous is not None
            and previous["shards"] != current["shards"]
            and cfg.shards_effective_window <= self._window
        ):
            log.warning(
                "SHARD LIST CHANGED (was %s) and applies at once, in window %d: unless every replica "
                "switched at this window's start, a client that moved replica gets a fresh quota on its new "
                "one for the rest of this window. Change the list at a window boundary: give every replica "
                "the new list with shards_effective_window set to the next window",
                ", ".join(previous["shards"]) or "not sharded",
                self._window,
            )
        if previous != current:
            try:
                self._log.set_meta("shards", json.dumps(current).encode())
            except Exception as exc:
                if storage_failure_reason(exc) is None:
                    raise
                log.warning("could not record the shard list in the report log (%s)", exc)

    def assigned_shard(self, client_id: str | None) -> str | None:
        """The address of the replica that serves ``client_id`` (None: not sharded, or an anonymous caller)."""
        if not self.shards or client_id is None:
            return None
        return assign_shard(client_id, self.shards)

    def check_shard(self, client_id: str | None, n_reports: int, digest: str | None = None) -> None:
        """Refuse (and count as rejects) ``n_reports`` reports of a client this replica does not serve:
        ``ShardListMismatch`` for a client routed by another list (``digest``, None: the client sent none),
        ``WrongShard`` for another replica's client, ``Unavailable`` before the shard list applies."""
        if digest is not None and digest != self.shards_digest:
            self._log.count_reject(RejectReason.SHARD_LIST_MISMATCH, n_reports)
            raise ShardListMismatch(digest, self.shards_digest)
        home = self.assigned_shard(client_id)
        if home is None:
            return
        start = self.config.shards_effective_window
        if self.window() < start:
            self._log.count_reject(RejectReason.SHARDS_NOT_EFFECTIVE, n_reports)
            wait = start * self.config.window_seconds - time.time()
            raise Unavailable(
                f"this replica's shard list applies from accounting window {start} (in {wait:.0f} s); retry then",
                retry_after=wait,
                reason=RejectReason.SHARDS_NOT_EFFECTIVE,
                error_reason=ErrorReason.NOTHING_STORED,
            )
        if home != self.config.shard_name:
            self._log.count_reject(RejectReason.WRONG_SHARD, n_reports)
            raise WrongShard(home, self.config.shard_name)

    def shard_assignment(self, client_id: str | None) -> shuffler_pb2.ShardAssignment:
        """What ``GetShards`` answers ``client_id``: the shard list, this replica's entry and the client's shard."""
        return shuffler_pb2.ShardAssignment(
            shards=self.shards,
            shard_name=self.config.shard_name,
            assigned_shard=self.assigned_shard(client_id) or "",
            effective_window=self.config.shards_effective_window,
            shards_digest=self.shards_digest,
            store_id=self.store_id,
        )

    # ------------------------------------------------------------------ plumbing

    def _storage_changed(self, ok: bool) -> None:
        self._set_health()
        if ok:
            self._wake_forwarder.set()

    def _set_health(self) -> None:
        """SERVING while the log is writable and the privacy unit is the curator's."""
        self.health.set_serving(self.storage.ok and not self.mismatch)

    def _check_space(self) -> None:
        """On the log thread: LowDiskSpace if free space (filesystem plus free pages inside the log) is
        below ``min_free_disk_bytes``."""
        free = self._log.free_bytes()
        self.disk_free_bytes = free
        if free is not None and free < self.config.min_free_disk_bytes:
            raise LowDiskSpace(
                f"{free} bytes free for the report log, fewer than min_free_disk_bytes="
                f"{self.config.min_free_disk_bytes}"
            )

    def _test_write(self) -> None:
        self._check_space()
        self._log.probe()

    async def _probe(self) -> None:
        """The test write after a storage failure; a release that failed must work too before ingest resumes."""
        await self._store.raw(self._test_write)
        await self._release_on_threshold()

    async def _release_on_threshold(self) -> None:
        """After a commit (or a recovery): release if the threshold is reached, keeping the next threshold's
        worth of reports back with ``keep_reserve``."""
        reserve = self._next_threshold if self.config.keep_reserve else 0
        if self.lease.held and self._log.takeable() >= self._threshold + reserve:
            await self.flush("threshold", reserve)

    def _commit_groups(self, groups, window: int) -> list:
        self._check_space()
        cfg = self.config
        cap = cfg.max_windows_per_client_per_period
        return self._log.append_groups(groups, window, cfg.reports_per_window, cfg.max_log_bytes, cap, self._period)

    def window(self, now: float | None = None) -> int:
        """The current accounting window (unix time // window_seconds)."""
        return int((time.time() if now is None else now) // self.config.window_seconds)

    def seconds_to_next_window(self) -> float:
        now = time.time()
        return (self.window(now) + 1) * self.config.window_seconds - now

    def _draw_threshold(self) -> int:
        return self.config.min_batch + geometric(self.config.batch_threshold_noise)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._supervised(loop))
            for loop in (self._commit_loop, self._forward_loop, self._interval_loop, self._lease_loop)
        ]
        self.storage.start()
        self._wake_forwarder.set()  # deliver batches left over from before a restart
        if self.config.metrics_port is not None:
            self.metrics_ready = self.metrics.endpoint.start_soon(self.config.metrics_host, self.config.metrics_port)

    async def _supervised(self, loop) -> None:
        """Run a background loop forever: an unexpected error is logged and the loop restarted,
        never silently lost; after a storage failure (already logged) it restarts once the log
        is writable again. Restarts wait ``RESTART_BACKOFF`` (full jitter below 0.5, 1, 2... up to 30 s)."""
        ceiling = RESTART_BACKOFF.initial
        while True:
            started = time.monotonic()
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except StorageFailed:
                await self.storage.wait_ok()
                continue
            except Exception:
                if time.monotonic() - started > STABLE_SECONDS:
                    ceiling = RESTART_BACKOFF.initial
                delay = retry.jittered(ceiling)
                log.exception("background task %s failed; restarting in %.1fs", loop.__name__, delay)
                await asyncio.sleep(delay)
                ceiling = RESTART_BACKOFF.grow(ceiling)

    async def stop(self) -> None:
        self.metrics.endpoint.close()
        await self.storage.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, _, fut, _, _ in self._pending:
            if not fut.done():
                fut.set_result(Unavailable("shuffler is shutting down; retry", error_reason=ErrorReason.NOTHING_STORED))
        self._pending, self._pending_bytes = [], 0
        with suppress(StorageFailed):
            await self._store.run(self._log.save_counters)
        with suppress(StorageFailed):
            await self._store.run(self._log.close)
        self._store.shutdown()
        self._state_lock.release()

    # ------------------------------------------------------------------ ingest

    def validate(self, reports) -> list[tuple[bytes, str | None, bytes]]:
        """(idempotency id, crowd id, serialized payload) per report, or InvalidArgument."""
        cfg = self.config
        if not reports:
            raise InvalidArgument("no reports in request")
        if len(reports) > cfg.max_reports_per_request:
            raise InvalidArgument(f"{len(reports)} reports in one request; at most {cfg.max_reports_per_request}")
        out = []
        unspecified = reports_pb2.PAYLOAD_ENCODING_UNSPECIFIED
        for i, r in enumerate(reports):
            if not MIN_IDEMPOTENCY_BYTES <= len(r.idempotency_id) <= MAX_IDEMPOTENCY_BYTES:
                raise InvalidArgument(
                    f"report {i}: idempotency_id must be {MIN_IDEMPOTENCY_BYTES}.."
                    f"{MAX_IDEMPOTENCY_BYTES} bytes, got {len(r.idempotency_id)}"
                )
            p = r.payload
            if p.encoding == unspecified:
                raise PayloadRejected(RejectReason.UNSPECIFIED_ENCODING, f"report {i}: payload encoding is unspecified")
            try:
                envelope.check_shape(p, cfg.allow_plaintext_payloads, cfg.max_report_bytes)
            except PayloadRejected as exc:
                raise PayloadRejected(exc.reason, f"report {i}: {exc}") from None
            if len(p.key_id) > MAX_KEY_ID_CHARS or len(r.crowd_id) > MAX_CROWD_ID_CHARS:
                raise InvalidArgument(f"report {i}: key_id or crowd_id longer than {MAX_KEY_ID_CHARS} characters")
            out.append((r.idempotency_id, r.crowd_id or None, p.SerializeToString()))
        return out

    async def submit(self, reports, client_id: str | None = None, shards_digest: str | None = None) -> list[bool]:
        """Validate, store durably (group commit), return stored/duplicate per report.

        ``client_id`` is the authenticated client (None: anonymous, authentication disabled); a
        sharded replica refuses a client it does not serve, or one routed by another shard list
        (``shards_digest``, as the client sent it), before anything else (``check_shard``).
        The caller must have stripped unknown fields so that only known payload fields are stored.
        """
        t0 = time.perf_counter()
        cfg = self.config
        self.check_shard(client_id, len(reports), shards_digest)
        try:
            items = self.validate(reports)
        except InvalidArgument as exc:
            reason = exc.reason if isinstance(exc, PayloadRejected) else RejectReason.INVALID_ARGUMENT
            self._log.count_reject(reason)
            exc.extra.setdefault("reason", reason)  # logged as reject_reason (lac.common.rpc)
            raise
        if self.mismatch:
            self._log.count_reject(RejectReason.DEPLOYMENT_MISMATCH, len(items))
            raise Unavailable(
                f"this shuffler acknowledges no report until its operator fixes its configuration ({self.mismatch}); "
                f"nothing was stored: retry later",
                retry_after=MISMATCH_RECHECK_SECONDS,
                reason=RejectReason.DEPLOYMENT_MISMATCH,
            )
        if not self.storage.ok:
            self._log.count_reject(RejectReason.STORAGE_UNAVAILABLE, len(items))
            refusal = self.storage.unavailable()
            refusal.error_reason = ErrorReason.NOTHING_STORED
            raise refusal
        size = sum(len(it[2]) for it in items)
        if self._pending_bytes and self._pending_bytes + size > cfg.max_pending_bytes:
            self._log.count_reject(RejectReason.OVERLOADED, len(items))
            raise Unavailable(
                f"ingest queue full ({self._pending_bytes} bytes wait for a durable commit; "
                f"max_pending_bytes={cfg.max_pending_bytes}); retry",
                retry_after=1,
                reason=RejectReason.OVERLOADED,
                error_reason=ErrorReason.NOTHING_STORED,
            )
        key = self._log.client_key(client_id) if client_id is not None else None
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((items, key, fut, t0, size))
        self._pending_bytes += size
        self._wake_committer.set()
        try:
            # shield: a call that gives up leaves its reports in the commit (a retry is then a duplicate)
            result = await asyncio.wait_for(asyncio.shield(fut), cfg.commit_timeout_seconds)
        except TimeoutError:
            self.storage.stalled("group commit")  # health is NOT_SERVING before this caller hears UNAVAILABLE
            raise Unavailable(
                f"the durable commit did not finish within commit_timeout_seconds="
                f"{cfg.commit_timeout_seconds:g}; the reports may or may not be stored: retry with "
                f"the same idempotency ids",
                retry_after=self.storage.delay,
            ) from None
        if isinstance(result, Exception):
            raise result
        tracing.set_attributes({"lac.reports": len(items)})
        if result == OVER_QUOTA:
            wait = self.seconds_to_next_window()
            raise ResourceExhausted(
                f"quota of {self.config.reports_per_window} report(s) per client per accounting "
                f"window reached; retry after {wait:.0f} s (next window)",
                retry_after=wait,
                reason=RejectReason.QUOTA,
            )
        if result == OVER_PERIOD_CAP:
            cap, period = self.config.max_windows_per_client_per_period, self._period
            wait = ((self.window() // period + 1) * period) * self.config.window_seconds - time.time()
            raise ResourceExhausted(
                f"this client contributed to {cap} accounting window(s) of the current period of {period} "
                f"window(s) already, the most the deployment allows (max_windows_per_client_per_period); retry "
                f"after {wait:.0f} s (next period)",
                retry_after=wait,
                reason=RejectReason.PERIOD_CAP,
            )
        if result == LOG_FULL:
            raise Unavailable(
                f"report log full ({self._log.used_bytes} of {self.config.max_log_bytes} bytes): "
                "the curator is not taking batches; retry later",
                retry_after=30,
                reason=RejectReason.LOG_FULL,
                error_reason=ErrorReason.NOTHING_STORED,
            )
        return result

    async def _commit_loop(self) -> None:
        while True:
            await self._wake_committer.wait()
            self._wake_committer.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                results = await self._commit(batch)
            finally:
                self._pending_bytes -= sum(b[4] for b in batch)
            now = time.perf_counter()
            for (_, _, fut, t0, _), r in zip(batch, results):
                self.metrics.ingest_seconds.observe(now - t0)
                if not fut.done():
                    fut.set_result(r)  # an exception is passed as a value: a caller gone since leaves no warning
            with suppress(StorageFailed):  # already logged; released after the recovery
                await self._release_on_threshold()

    async def _commit(self, batch: list) -> list:
        """One group commit of ``batch``: a result or an exception per call. A commit that takes longer
        than commit_timeout_seconds marks the storage as stalled (its callers have given up by then)."""
        try:
            return await self._store.run(self._commit_groups, [(b[0], b[1]) for b in batch], self.window())
        except StorageFailed:
            return [self.storage.unavailable() for _ in batch]
        except Exception:
            log.exception("group commit failed")
            return [Unavailable("report log write failed; retry later", retry_after=1) for _ in batch]

    # ------------------------------------------------------------------ release

    async def flush(self, why: str = "flush", reserve: int = 0) -> tuple[str, int] | None:
        """Release one anonymised shuffled batch if the release threshold is reached (never below it),
        keeping a uniformly random ``reserve`` of the buffered clients' reports back.

        The threshold is min_batch plus, with ``batch_threshold_noise``, a secret random amount
        drawn anew after each release; it counts distinct clients among the buffered reports.
        """
        cfg = self.config
        if not self.lease.held and not await self._check_lease():
            raise Unavailable(
                "another shuffler replica over this report log's database holds the release lease and releases the "
                "batches (GetStatus's release_lease says which); flush there, or wait: it releases at the threshold "
                "and at the end of each release interval",
                retry_after=CHECK_SECONDS,
            )
        released = await self._store.run(
            self._log.release, self._threshold, cfg.subsample_q, cfg.crowd_threshold, cfg.max_batch_bytes, reserve
        )
        if released is None:
            n = self._log.takeable()
            bar = (
                f"min_batch={cfg.min_batch}"
                if not cfg.batch_threshold_noise
                else f"the randomised threshold (min_batch={cfg.min_batch} + secret noise)"
            )
            self.note = (
                f"{why} in window {self.window()}: reports of {n} distinct clients buffered, fewer than "
                f"{bar}: carried over"
            )
            return None
        self._threshold, self._next_threshold = self._next_threshold, self._draw_threshold()
        dropped = ""
        if released.dropped_subsampled or released.dropped_crowd:
            dropped = (
                f"; dropped {released.dropped_subsampled} by sub-sampling (q={cfg.subsample_q:g}) and "
                f"{released.dropped_crowd} by the crowd threshold (k={cfg.crowd_threshold})"
            )
        if released.batch_id is None:
            self.note = f"{why}: all {released.considered} taken reports were dropped{dropped}"
            return None
        parts = f" in {released.parts} batches of at most {cfg.max_batch_bytes} bytes" if released.parts > 1 else ""
        if released.oversized:
            parts += f" ({released.oversized} larger: a batch is never cut below the threshold)"
            log.warning(
                "batch %s: %d batch(es) of this release exceed max_batch_bytes=%d, since the threshold's reports "
                "did not fit in it; raise max_batch_bytes (the curator refuses a batch over its max_message_bytes)",
                released.batch_id,
                released.oversized,
                cfg.max_batch_bytes,
                extra={"batch_id": released.batch_id},
            )
        left = self._log.buffered()
        kept = "a reserve kept back for the next batch (keep_reserve) and " if reserve else ""
        self.note = (
            f"{why}: released batch {released.batch_id} of {released.size} reports{parts}{dropped}; "
            f"{left} report(s) carried over: {kept}other reports of clients already in it"
        )
        log.info(
            "released batch %s of %d shuffled reports (%s)%s",
            released.batch_id,
            released.size,
            why,
            dropped,
            extra={
                "batch_id": released.batch_id,
                "reports": released.size,
                "trigger": why,
                "dropped_subsampled": released.dropped_subsampled,
                "dropped_crowd": released.dropped_crowd,
            },
        )
        self._wake_forwarder.set()
        return released.batch_id, released.size

    def privacy(self, batch: StoredBatch, deployment: Deployment) -> reports_pb2.BatchPrivacy:
        """The amplification statement of ``batch`` under the curator's ``deployment``."""
        g, method = batch_guarantee(batch, deployment, self.config)
        cfg = self.config
        return reports_pb2.BatchPrivacy(
            n_reports=batch.n,
            report_epsilon0=deployment.report_epsilon0,
            delta=g.delta,
            central_epsilon=g.epsilon,
            amplified=method != "none",
            method=method,
            subsample_q=cfg.subsample_q,
            crowd_threshold=cfg.crowd_threshold,
            statement=g.statement(),
            distinct_clients=batch.distinct_clients,
            reports_per_window=cfg.reports_per_window,
            window_seconds=cfg.window_seconds,
            first_window=batch.first_window,
            last_window=batch.last_window,
            windows_per_period=cfg.max_windows_per_client_per_period,
            period_seconds=cfg.period_days * 86400.0,
        )

    # ------------------------------------------------------------------ the curator's deployment

    def deployment(self) -> Deployment:
        """The curator's published deployment (relayed to clients), or Unavailable until it is known."""
        if self._deployment is None:
            raise Unavailable(
                "the curator's deployment configuration is not known yet (the curator has not been "
                "reachable since this shuffler started); retry later",
                retry_after=5,
            )
        return self._deployment

    def _note_mismatch(self, d: Deployment) -> None:
        """Compare this shuffler's privacy unit with the curator's deployment ``d``: while they differ, Submit is
        refused and health is NOT_SERVING; each change is logged once (ERROR, or INFO when they agree again)."""
        cfg, cap = self.config, self.config.max_windows_per_client_per_period
        why = []
        if (d.reports_per_window, d.window_seconds) != (cfg.reports_per_window, cfg.window_seconds):
            why.append(
                f"its quota is {cfg.reports_per_window} report(s) per {cfg.window_seconds:g} s window but the "
                f"curator's privacy unit is {d.reports_per_window} per {d.window_seconds:g} s window "
                f"(reports_per_window, window_seconds)"
            )
        if (d.windows_per_period, d.windows_in_period) != (cap, self._period):
            why.append(
                f"it caps a client at {cap} window(s) per period of {self._period} windows but the curator's "
                f"deployment at {d.windows_per_period} per {d.windows_in_period} (max_windows_per_client_per_period, "
                f"period_days; 0: no cap)"
            )
        mismatch = "; ".join(why)
        if mismatch != self.mismatch:
            if mismatch:
                log.error(
                    "MISCONFIGURED: %s. The curator would refuse every batch of such reports: Submit answers "
                    "UNAVAILABLE and health is NOT_SERVING until both agree",
                    mismatch,
                    extra={"reject_reason": str(RejectReason.DEPLOYMENT_MISMATCH)},
                )
            else:
                log.info("this shuffler's privacy unit is the curator's again: Submit is served")
        self.mismatch = mismatch
        self._set_health()

    async def _refresh_deployment(self, channel) -> Deployment | None:
        fresh = MISMATCH_RECHECK_SECONDS if self.mismatch else DEPLOYMENT_REFRESH_SECONDS
        if self._deployment is not None and time.monotonic() - self._deployment_at < fresh:
            return self._deployment
        try:
            reply = await curator_pb2_grpc.CuratorStub(channel).GetDeployment(
                reports_pb2.DeploymentRequest(), timeout=30
            )
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "could not fetch the curator's deployment (%s: %s)",
                exc.code().name,
                exc.details(),
                extra={"method": "GetDeployment", "status_code": exc.code().name},
            )
            return self._deployment
        d = deployment_from_proto(reply)
        self._note_mismatch(d)
        if d != self._deployment:
            log.info("curator deployment: %s", d.report_guarantee().statement())
            with suppress(StorageFailed):  # only the cache for the next start; logged once as a storage failure
                await self._store.run(self._log.set_meta, "deployment", reply.SerializeToString())
        self._deployment, self._deployment_at = d, time.monotonic()
        return d

    def deployment_message(self) -> reports_pb2.Deployment:
        """The curator's deployment as this shuffler relays it (``server_version`` names this shuffler)."""
        return deployment_to_proto(self.deployment(), server_version=server_version("shuffler"))

    # ------------------------------------------------------------------ loops

    async def _interval_loop(self) -> None:
        interval = self.config.release_interval_seconds
        while True:
            await asyncio.sleep(interval - time.time() % interval + 0.001)
            if self.lease.held:  # the housekeeping too is the lease holder's alone
                await self.flush("end of release interval")
                await self._store.run(self._log.prune_quota, self.window(), self._period)
                await self._store.run(self._log.rotate_seen, self.config.idempotency_window_days * 86400.0)
            await self._store.run(self._log.save_counters)

    async def _lease_loop(self) -> None:
        """Every ``CHECK_SECONDS``: the release lease's holder checks it, reads the buffered counts from a shared
        database (every replica stores reports into it) and releases at the threshold; the others try to take it."""
        while True:
            await self._check_lease()
            if self.lease.held:
                with suppress(StorageFailed):  # logged once by the StorageGuard; the lease is checked on meanwhile
                    if self._log.shared:
                        await self._store.run(self._log.recount)
                    await self._release_on_threshold()
            await asyncio.sleep(CHECK_SECONDS)

    async def _check_lease(self) -> bool:
        """Check the release lease if this replica holds it, else try to take it; whether it holds it now. A lost
        lease cancels the deliveries in flight at once (the next holder sends those batches under the same ids)."""
        async with self._lease_lock:
            was = self.lease.held
            try:
                held = await asyncio.wait_for(
                    asyncio.to_thread(self.lease.check if was else self.lease.acquire), CHECK_TIMEOUT_SECONDS
                )
            except TimeoutError:
                await asyncio.to_thread(self.lease.release)
                held = False
            if held and not was:
                log.info("this replica holds the release lease: it releases and forwards the batches")
                self._wake_forwarder.set()
            elif was and not held:
                log.warning(
                    "RELEASE LEASE LOST (its database session ended or did not answer within %gs): no longer "
                    "releasing or forwarding; %d deliveries in flight cancelled, another replica sends them again",
                    CHECK_TIMEOUT_SECONDS,
                    len(self._deliveries),
                )
                for task in self._deliveries.values():
                    task.cancel()
            return held

    def _forward_backoff(self) -> retry.Backoff:
        """The forwarder's back-off (deployment fetches and deliveries alike): waits drawn below 0.5, 1, 2...
        s up to ``forward_retry_max_seconds`` (full jitter, ``lac.common.retry``)."""
        longest = self.config.forward_retry_max_seconds
        longest = longest if math.isfinite(longest) and longest > 0 else FORWARD_RETRY_MIN_SECONDS
        return retry.Backoff(initial=min(FORWARD_RETRY_FIRST_SECONDS, longest), maximum=longest)

    async def _forward_loop(self) -> None:
        """Deliver the pending batches, up to ``forward_in_flight`` at once, each until the curator acknowledges
        it (then, and only then, it is marked delivered). A batch is never sent twice at once; one sent again
        after a restart carries the same id, which the curator de-duplicates."""
        backoff = self._forward_backoff()
        ceiling = backoff.initial  # of the next wait for the deployment
        sending = self._deliveries
        async with tls.channel(self.config.curator, self._curator_tls, aio=True) as channel:
            # Raw bytes: the batch's request is built once from the log and sent as built.
            ingest: grpc.aio.UnaryUnaryMultiCallable[bytes, curator_pb2.IngestBatchResponse] = channel.unary_unary(
                _INGEST_METHOD,
                request_serializer=None,
                response_deserializer=curator_pb2.IngestBatchResponse.FromString,
            )

            def finished(task: asyncio.Task) -> None:
                self._wake_forwarder.set()  # a slot is free, and a failure is raised by _reap

            try:
                while True:
                    await self._refresh_deployment(channel)
                    if self._deployment is None:
                        await asyncio.sleep(retry.jittered(ceiling))
                        ceiling = backoff.grow(ceiling)
                        continue
                    # woken by a release or a finished delivery, or in time to fetch the deployment again
                    fresh = MISMATCH_RECHECK_SECONDS if self.mismatch else DEPLOYMENT_REFRESH_SECONDS
                    with suppress(TimeoutError):
                        await asyncio.wait_for(self._wake_forwarder.wait(), fresh)
                    self._wake_forwarder.clear()
                    _reap(sending)
                    if not self.lease.held:
                        continue
                    for batch_id in await self._store.run(self._log.pending_batches):
                        if batch_id in sending:
                            continue
                        while len(sending) >= self.config.forward_in_flight:
                            await asyncio.wait(list(sending.values()), return_when=asyncio.FIRST_COMPLETED)
                            _reap(sending)
                        if not self.lease.held:
                            break
                        task = asyncio.create_task(self._deliver(ingest, channel, batch_id))
                        task.add_done_callback(finished)
                        sending[batch_id] = task
            finally:
                for task in sending.values():
                    task.cancel()
                await asyncio.gather(*sending.values(), return_exceptions=True)

    async def _deliver(self, ingest, channel, batch_id: str) -> None:
        """Send one pending batch until the curator acknowledges it, then mark it delivered."""
        backoff = self._forward_backoff()
        ceiling = backoff.initial  # of the next wait; each batch in flight backs off on its own
        batch = await self._store.run(self._log.batch, batch_id)
        privacy = batch.privacy
        if privacy is None:
            await self._refresh_deployment(channel)
            deployment = self.deployment()  # known: set before the forwarder sends anything, never unset
            stmt = await asyncio.get_running_loop().run_in_executor(None, self.privacy, batch, deployment)
            privacy = stmt.SerializeToString()
            await self._store.durably(self._log.set_privacy, batch_id, privacy)
        body, n = wire.with_privacy(batch.body, privacy), batch.n
        del batch  # its body: only ``body`` is kept while the batch is in flight
        while True:
            sent = time.perf_counter()
            try:
                # a new trace per attempt, never a child of a client's Submit: see lac.common.tracing
                attributes = {"lac.batch_id": batch_id, "lac.reports": n, "rpc.method": "IngestBatch"}
                with tracing.span("shuffler.forward_batch", attributes, root=True, client=True):
                    reply = await ingest(body, timeout=120, metadata=tracing.inject() or None)
                    tracing.set_attributes({"lac.accepted": reply.accepted, "lac.rejected": reply.rejected})
            except grpc.aio.AioRpcError as exc:
                self.metrics.forward_seconds.labels(exc.code().name).observe(time.perf_counter() - sent)
                self.forward_failures += 1
                if exc.code() in DEAD_LETTER_CODES:
                    await self._set_aside(batch_id, f"{exc.code().name}: {exc.details()}")
                    return
                delay = retry.jittered(ceiling)
                log.warning(
                    "curator did not take batch %s (%s: %s); retrying in %.1fs",
                    batch_id,
                    exc.code().name,
                    exc.details(),
                    delay,
                    extra={
                        "batch_id": batch_id,
                        "method": "IngestBatch",
                        "status_code": exc.code().name,
                        "retry_in_seconds": delay,
                    },
                )
                await asyncio.sleep(delay)
                ceiling = backoff.grow(ceiling)
                continue
            self.metrics.forward_seconds.labels("OK").observe(time.perf_counter() - sent)
            await self._store.durably(self._log.delivered, batch_id)
            log.info(
                "curator acknowledged batch %s (%d accepted, %d rejected%s)",
                batch_id,
                reply.accepted,
                reply.rejected,
                ", already stored" if reply.duplicate else "",
                extra={
                    "batch_id": batch_id,
                    "method": "IngestBatch",
                    "status_code": "OK",
                    "accepted": reply.accepted,
                    "rejected": reply.rejected,
                    "duplicate": reply.duplicate,
                },
            )
            return

    async def _set_aside(self, batch_id: str, refusal: str) -> None:
        """Make a batch the curator refused for good a dead letter, so the batches after it are delivered."""
        await self._store.durably(self._log.dead_letter, batch_id, refusal)
        log.error(
            "the curator refused batch %s for good (%s): set aside as a dead letter, newer batches go on; see "
            "`lac shuffler dead-letter list`, then retry or drop it",
            batch_id,
            refusal,
            extra={"batch_id": batch_id, "method": "IngestBatch", "status_code": refusal.split(":", 1)[0]},
        )

    # ------------------------------------------------------------------ dead letters (operator)

    async def dead_letters(self) -> shuffler_pb2.DeadLetters:
        """Every dead letter, oldest first."""
        rows = await self._store.run(self._log.dead_letters)
        return shuffler_pb2.DeadLetters(
            batches=[
                shuffler_pb2.DeadLetter(
                    batch_id=b,
                    size=n,
                    refusal=refusal,
                    dead_since_unix=since,
                    privacy=reports_pb2.BatchPrivacy.FromString(p or b""),
                )
                for b, n, refusal, since, p in rows
            ]
        )

    async def settle_dead_letters(self, batch_ids: list[str], every: bool, drop: bool) -> shuffler_pb2.DeadLetterResult:
        """Retry (pending again) or drop (deleted with their reports) the dead letters named, or ``every`` one."""
        if bool(batch_ids) == every:
            raise InvalidArgument("name the dead letters' batch ids, or ask for all of them (--all), not both")
        if any(len(b) > MAX_BATCH_ID_CHARS for b in batch_ids):  # their number is bounded before parsing
            raise InvalidArgument(f"batch ids have at most {MAX_BATCH_ID_CHARS} characters")
        try:
            done = await self._store.run(
                self._log.drop_dead if drop else self._log.retry_dead, None if every else batch_ids
            )
        except KeyError as exc:
            unknown = exc.args[0]
            named = ", ".join(repr(b[:40]) for b in unknown[:3]) + (
                f" and {len(unknown) - 3} more" * (len(unknown) > 3)
            )
            raise NotFound(f"not dead letters of this shuffler: {named}; nothing was changed") from None
        reports = sum(n for _, n in done)
        log.warning(
            "%s %d dead letter(s) of %d report(s) at the operator's request%s",
            "dropped" if drop else "retrying",
            len(done),
            reports,
            ": their reports are deleted, never delivered" if drop else "",
            extra={"batches": len(done), "reports": reports},
        )
        if not drop:
            self._wake_forwarder.set()
        return shuffler_pb2.DeadLetterResult(batch_ids=[b for b, _ in done], reports=reports)

    # ------------------------------------------------------------------ operator view

    async def status(self) -> shuffler_pb2.ShufflerStatus:
        await self.recount()
        counters = await self._store.run(self._log.counters)
        pending = await self._store.run(self._log.pending_batches)
        dead = await self._store.run(self._log.dead_letters)
        recent = await self._store.run(self._log.recent_batches)
        cfg = self.config
        notes = [
            f"STORAGE FAILING: {self.storage.error}; " if self.storage.error else "",
            f"MISCONFIGURED: {self.mismatch}; " if self.mismatch else "",
            f"{len(dead)} dead letter(s): lac shuffler dead-letter list; " if dead else "",
        ]
        return shuffler_pb2.ShufflerStatus(
            buffered_reports=self._log.buffered(),
            buffered_clients=self._log.takeable(),
            min_batch=cfg.min_batch,
            batches_forwarded=counters.get("batches_forwarded", 0),
            reports_forwarded=counters.get("reports_forwarded", 0),
            batches_pending=len(pending),
            rejects={k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("reject:")},
            note="".join(notes) + self.note,
            window=self.window(),
            seconds_to_next_window=self.seconds_to_next_window(),
            log_bytes=self._log.used_bytes,
            max_log_bytes=cfg.max_log_bytes,
            counters={k: v for k, v in counters.items() if not k.startswith("reject:")},
            recent_batches=[
                shuffler_pb2.BatchInfo(
                    batch_id=b,
                    size=n,
                    delivered=bool(d),
                    privacy=reports_pb2.BatchPrivacy.FromString(p or b""),
                    refusal=dead or "",
                )
                for b, n, d, p, dead in recent
            ],
            auth="token" if self.auth.enabled else "none (INSECURE)",
            batches_dead_letter=len(dead),
            deployment_mismatch=self.mismatch,
            release_lease=self.lease.held,
        )

    async def count_reject(self, reason: RejectReason, n: int = 1) -> None:
        self._log.count_reject(reason, n)

    @property
    def pending_bytes(self) -> int:
        """Payload bytes received and waiting for their durable commit."""
        return self._pending_bytes

    async def counters(self) -> dict[str, int]:
        return await self._store.run(self._log.counters)

    async def batches_pending(self) -> int:
        """Released batches the curator has not acknowledged yet (dead letters aside)."""
        return len(await self._store.run(self._log.pending_batches))

    async def batches_dead_letter(self) -> int:
        """Batches the curator refused for good, set aside."""
        return len(await self._store.run(self._log.dead_letters))

    def buffered(self) -> int:
        return self._log.buffered()

    async def recount(self) -> None:
        """Read the buffered counts from a shared database (``ReportLog.recount``) for ``buffered`` and the status."""
        await self._store.run(self._log.recount)

    def used_bytes(self) -> int:
        return self._log.used_bytes
