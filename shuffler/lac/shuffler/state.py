"""What the shuffler's handlers share (``ShufflerState``): the configuration, the report log and its store thread,
the release lease, the shard list, the storage guard and health, the metrics, the ingest queue, the release
thresholds and the cache of the curator's deployment. No RPC logic: the handlers (``intake``, ``releases``,
``forward``, ``shards``, ``status``) act on it, ``lifecycle`` opens, starts and stops it.

All SQLite work runs on one dedicated thread (``store``); the asyncio loop only awaits it.

Before acknowledging anything, the shuffler checks its privacy unit (reports per window, window length, the cap
on windows per period) against the curator's published deployment, the one last fetched (kept across restarts)
or, at a first start, the first one fetched: while they differ (``mismatch``), Submit answers UNAVAILABLE (reject
``deployment_mismatch``) and health is NOT_SERVING, since every batch of such reports would be refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from lac.common import tls
from lac.common.deployment import Deployment, windows_in_period
from lac.common.errors import RejectReason
from lac.common.rpc import parse_names
from lac.common.server import Health
from lac.common.statelock import StateDirLock
from lac.common.storage import LowDiskSpace, StorageGuard, StoreThread
from lac.shuffler import serde
from lac.shuffler.auth import ShufflerAuth
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.metrics import ShufflerMetrics
from lac.shuffler.reportlog import ReportLog
from lac.shuffler.shards import shards_digest
from lac.shuffler.shuffle import geometric

log = logging.getLogger(__name__)

MISMATCH_RECHECK_SECONDS = 30.0  # how soon the curator's deployment is fetched again while it differs


class ShufflerState:
    """The state the shuffler's handlers share (also usable directly in tests, without gRPC).

    ``after_probe`` runs after a successful test write of a failing log, before ingest resumes (the lifecycle
    passes the release due then: a release that failed must work too)."""

    def __init__(self, config: ShufflerConfig, after_probe: Callable[[ShufflerState], Awaitable[None]] | None = None):
        self.config = config
        self.period = windows_in_period(config.period_days * 86400.0, config.window_seconds)  # windows per period
        self.state_lock = StateDirLock(config.state_dir, "shuffler")  # one writer per state directory
        self.curator_tls = tls.client_tls(
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
        self.reportlog = ReportLog(config.state_dir, config.store)
        self.store_id = self.reportlog.store_id
        self.lease = self.reportlog.lease  # this replica releases and forwards only while it holds it
        self.lease_lock = asyncio.Lock()
        self.deliveries: dict[str, asyncio.Task] = {}  # batch id -> its delivery, while this replica holds the lease
        self.wake_forwarder = asyncio.Event()
        self.pending: list = []  # (items, client key, future, arrival time, payload bytes) per Submit
        self.pending_bytes = 0  # payload bytes received and waiting for their durable commit
        self.wake_committer = asyncio.Event()
        self.health = Health([serde.SERVICE_NAME])
        self.after_probe = after_probe
        self.storage = StorageGuard(
            "report log",
            "Submit answers UNAVAILABLE and health is NOT_SERVING; acknowledged reports are kept",
            probe=self._probe,
            on_change=self._storage_changed,
            check_space=lambda: self.store.raw(self.check_space),
            advice="the reports may or may not be stored: retry later with the same idempotency ids",
            stall_seconds=config.commit_timeout_seconds,
            stall_setting="commit_timeout_seconds",
        )
        self.store = StoreThread("reportlog", self.storage)
        self.disk_free_bytes: int | None = None
        self.tasks: list[asyncio.Task] = []  # the background loops, while started
        self.metrics_ready: asyncio.Future | None = None  # the metrics endpoint's start, with metrics_port
        self.threshold = self.draw_threshold()
        self.next_threshold = self.draw_threshold()  # the reserve with keep_reserve
        cached = self.reportlog.get_meta("deployment")  # the last one fetched, so a restart knows it at once
        self.deployment: Deployment | None = serde.deployment_from_bytes(cached) if cached else None
        self.deployment_at = 0.0
        self.mismatch = ""  # why this shuffler's privacy unit is not the curator's ("" while they agree)
        if self.deployment is not None:
            self.note_mismatch(self.deployment)
        self.forward_failures = 0
        self.metrics = ShufflerMetrics(self)  # served at metrics_host:metrics_port once started (operator only)
        self.note = ""
        self.shards = config.shard_list
        self.shards_digest = shards_digest(self.shards)

    # ------------------------------------------------------------------ storage and health

    def _storage_changed(self, ok: bool) -> None:
        self.set_health()
        if ok:
            self.wake_forwarder.set()

    def set_health(self) -> None:
        """SERVING while the log is writable and the privacy unit is the curator's."""
        self.health.set_serving(self.storage.ok and not self.mismatch)

    def check_space(self) -> None:
        """On the log thread: LowDiskSpace if free space (filesystem plus free pages inside the log) is
        below ``min_free_disk_bytes``."""
        free = self.reportlog.free_bytes()
        self.disk_free_bytes = free
        if free is not None and free < self.config.min_free_disk_bytes:
            raise LowDiskSpace(
                f"{free} bytes free for the report log, fewer than min_free_disk_bytes="
                f"{self.config.min_free_disk_bytes}"
            )

    def _test_write(self) -> None:
        self.check_space()
        self.reportlog.probe()

    async def _probe(self) -> None:
        """The test write after a storage failure; a release that failed must work too before ingest resumes."""
        await self.store.raw(self._test_write)
        if self.after_probe is not None:
            await self.after_probe(self)

    # ------------------------------------------------------------------ windows and thresholds

    def window(self, now: float | None = None) -> int:
        """The current accounting window (unix time // window_seconds)."""
        return int((time.time() if now is None else now) // self.config.window_seconds)

    def seconds_to_next_window(self) -> float:
        """Seconds until the next accounting window begins."""
        now = time.time()
        return (self.window(now) + 1) * self.config.window_seconds - now

    def draw_threshold(self) -> int:
        """A release threshold: min_batch plus, with ``batch_threshold_noise``, a secret geometric amount."""
        return self.config.min_batch + geometric(self.config.batch_threshold_noise)

    # ------------------------------------------------------------------ the curator's deployment

    def note_mismatch(self, d: Deployment) -> None:
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
        if (d.windows_per_period, d.windows_in_period) != (cap, self.period):
            why.append(
                f"it caps a client at {cap} window(s) per period of {self.period} windows but the curator's "
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
        self.set_health()

    # ------------------------------------------------------------------ reads (metrics, status, tests)

    def count_reject(self, reason: RejectReason, n: int = 1) -> None:
        """Count ``n`` reports refused for ``reason``."""
        self.reportlog.count_reject(reason, n)

    async def counters(self) -> dict[str, int]:
        """The report log's counters (accepted, duplicates, rejects by reason, batches...)."""
        return await self.store.run(self.reportlog.counters)

    async def batches_pending(self) -> int:
        """Released batches the curator has not acknowledged yet (dead letters aside)."""
        return len(await self.store.run(self.reportlog.pending_batches))

    async def batches_dead_letter(self) -> int:
        """Batches the curator refused for good, set aside."""
        return len(await self.store.run(self.reportlog.dead_letters))

    def buffered(self) -> int:
        """Reports waiting for a batch."""
        return self.reportlog.buffered()

    async def recount(self) -> None:
        """Read the buffered counts from a shared database (``ReportLog.recount``) for ``buffered`` and the status."""
        await self.store.run(self.reportlog.recount)

    def used_bytes(self) -> int:
        """Bytes used by the report log."""
        return self.reportlog.used_bytes
