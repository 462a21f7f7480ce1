"""The state the curator's handlers share (``lac.curator.service.handlers``): its configuration, the store behind
its thread and storage guard, the ingest workers, the release engine, the local channel's future, the model cache
and the metrics. No RPC logic: ``lac.curator.service.lifecycle`` builds, starts and stops it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from lac.common import envelope
from lac.common.privacy import Budget
from lac.common.rng import RandomSource
from lac.common.rpc import Role
from lac.common.server import Health
from lac.common.statelock import StateDirLock
from lac.common.storage import StorageGuard, StoreThread
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.engines.local import Engine
from lac.curator.ingest.chunks import IngestPool
from lac.curator.lm.model import NgramModel
from lac.curator.release.building import PublicCaps, StoredReports
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap
from lac.curator.runner.run import ReleaseRecord
from lac.curator.service.channel import ChannelProgress
from lac.curator.service.config import CuratorConfig
from lac.curator.service.metrics import CuratorMetrics
from lac.curator.store.store import CuratorStore

if TYPE_CHECKING:
    from lac.curator.ingest.spark import SparkIngest

MAX_CLOCK_SKEW_SECONDS = 300.0  # a batch's newest window may be this far ahead of the curator's clock


class CuratorState:
    """One curator's shared state (built by ``lifecycle.open_state``; the handlers read and update it)."""

    def __init__(
        self,
        config: CuratorConfig,
        vocab: NgramVocabulary,
        store: CuratorStore,
        state_lock: StateDirLock,
        service_names: list[str],
        channel_since: int | None,
        keyring: envelope.CuratorKeyRing | None,
        engine: Engine,
        make_ingest: Callable[[Callable[[bool], None]], tuple[SparkIngest | IngestPool, Engine | None]],
        rng: RandomSource | None,
        channel_progress: ChannelProgress,
    ):
        """``store``: opened under ``state_lock``; ``service_names``: those health reports on; ``channel_since``: the
        window from which every stored report was made at the local channel's ε (None: every window);
        ``make_ingest(on_change)``: the ingest workers, reporting to health, and a Spark session started for them
        alone (or None)."""
        self.config = config
        self.vocab = vocab
        self.deployment = config.deployment
        self.caps = PublicCaps(
            W=config.max_items_per_report,
            C=config.item_clamp,
            count_clip=config.item_count_clip,
            validation_cap=config.endtoend_validation_cap,
        )
        self.exporting = bool(config.roles[Role.EXPORT])  # reports' words are kept only then (for export)
        self.store = store
        self.state_lock = state_lock  # one writer per state directory
        self.channel_since = channel_since
        self.words_lock = asyncio.Lock()  # a purge of words files waits for an export reading them
        self.purger: asyncio.Task | None = None
        self.health = Health(service_names)
        self.health_lock = threading.Lock()
        self.storage = StorageGuard(
            f"curator storage (segments and {'PostgreSQL' if config.store else 'SQLite'})",
            "IngestBatch and Release answer UNAVAILABLE and health is "
            "NOT_SERVING; acknowledged batches and releases are kept",
            probe=lambda: self.store_thread.raw(self.store.probe),
            on_change=self.serving,
            check_space=lambda: self.store_thread.raw(self.store.check_space),
            stall_seconds=config.stall_timeout_seconds,
            stall_setting="stall_timeout_seconds",
        )
        self.store_thread = StoreThread("curator-store", self.storage)
        self.inflight: dict[str, tuple[str, asyncio.Task[ReleaseRecord]]] = {}  # releases running, by request id
        self.rng = rng  # None: a fresh CSPRNG generator per release (production)
        self.bootstrap = Bootstrap(config.error_bar_draws)  # its own generator, seeded from the OS per release
        self.keyring = keyring
        self.engine = engine  # where releases' aggregations run (lac.curator.engines.local); noise and ledger stay here
        self.ingest, self.spark = make_ingest(self.serving)  # spark: a session started for ingest alone
        self.ingest_started: asyncio.Future[list[int]] | None = None  # the workers' start (lifecycle.start)
        self.models: OrderedDict[str, NgramModel] = OrderedDict()
        self.model_lock = asyncio.Lock()
        self.channel_future: asyncio.Future[NgramChannel | None] | None = None  # the local channel, once started
        self.channel_progress = channel_progress  # how far it is (releases, previews, metrics)
        self.channel_missing = ""  # why the local channel the configuration expects could not be had ("": it could)
        self.closing = threading.Event()
        self.metrics = CuratorMetrics(self)  # served at metrics_host:metrics_port once started (operator only)
        self.metrics_ready: asyncio.Future | None = None

    def serving(self, _changed: bool = True) -> None:
        """Health SERVING while the storage works and the ingest workers run (called from any thread)."""
        with self.health_lock:
            self.health.set_serving(self.storage.ok and self.ingest.ok)

    @property
    def budget(self) -> Budget:
        """The (ε, δ) budget of each accounting window."""
        return Budget(self.config.budget_epsilon, self.config.budget_delta)

    def channel(self) -> NgramChannel | None:
        """The local channel the default release uses, None without one; UNAVAILABLE (with the progress, the
        time left and a retry-after) while it is being read or sampled: a release never waits for it silently."""
        if self.channel_future is None:
            return None
        if not self.channel_future.done():
            raise self.channel_progress.unavailable()
        return self.channel_future.result()

    def newest_window(self) -> int:
        """The newest accounting window a stored report may be in (the current one, allowing for a
        shuffler whose clock is up to MAX_CLOCK_SKEW_SECONDS ahead)."""
        return self.deployment.window(time.time() + MAX_CLOCK_SKEW_SECONDS)

    def reports(self, first_window: int, last_window: int) -> StoredReports:
        """The stored reports of those windows, read segment by segment."""
        return StoredReports(self.store.segment_paths(first_window, last_window), self.vocab)
