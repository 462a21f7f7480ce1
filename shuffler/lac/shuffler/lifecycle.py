"""Open, start and stop a shuffler: its state (``lac.shuffler.state``) and its background loops.

The loops live in the handler module of their family: the group commit in ``intake``, the release interval and
the release lease in ``releases``, the delivery to the curator in ``forward``; the storage guard's probes are
``StorageGuard``'s (``lac.common.storage``), started and stopped here.

Storage failures (full disk, I/O errors, a commit that stalls, free space below
``min_free_disk_bytes``) never end a background task and never leave a call waiting: the first
one is logged once, counted (``lac_shuffler_storage_failures_total``), turns gRPC health to
NOT_SERVING, and from then on Submit answers UNAVAILABLE with ``retry-after-seconds`` at once.
``lac.common.storage.StorageGuard`` (shared with the curator) then test-writes the log with a
growing back-off; the first success (and the release then due, if any) restores SERVING.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress

from lac.common import retry
from lac.common.errors import ErrorReason, Unavailable
from lac.common.storage import STABLE_SECONDS, StorageFailed
from lac.shuffler import forward, intake, releases
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.shards import note_shard_change
from lac.shuffler.state import ShufflerState

log = logging.getLogger(__name__)

RESTART_BACKOFF = retry.Backoff(initial=0.5, maximum=30.0)  # a failed background loop's restarts
LOOPS = (intake.commit_loop, forward.forward_loop, releases.interval_loop, releases.lease_loop)


def open_state(config: ShufflerConfig) -> ShufflerState:
    """The state of a shuffler over ``config``'s state directory (locked: one writer), its shard list noted."""
    state = ShufflerState(config, after_probe=releases.release_on_threshold)
    note_shard_change(state)
    return state


def start(state: ShufflerState) -> None:
    """Start the background loops, the storage guard and, with ``metrics_port``, the metrics endpoint."""
    state.tasks = [asyncio.create_task(_supervised(state, loop)) for loop in LOOPS]
    state.storage.start()
    state.wake_forwarder.set()  # deliver batches left over from before a restart
    if state.config.metrics_port is not None:
        state.metrics_ready = state.metrics.endpoint.start_soon(state.config.metrics_host, state.config.metrics_port)


async def _supervised(state: ShufflerState, loop) -> None:
    """Run a background loop forever: an unexpected error is logged and the loop restarted,
    never silently lost; after a storage failure (already logged) it restarts once the log
    is writable again. Restarts wait ``RESTART_BACKOFF`` (full jitter below 0.5, 1, 2... up to 30 s)."""
    ceiling = RESTART_BACKOFF.initial
    while True:
        started = time.monotonic()
        try:
            await loop(state)
        except asyncio.CancelledError:
            raise
        except StorageFailed:
            await state.storage.wait_ok()
            continue
        except Exception:
            if time.monotonic() - started > STABLE_SECONDS:
                ceiling = RESTART_BACKOFF.initial
            delay = retry.jittered(ceiling)
            log.exception("background task %s failed; restarting in %.1fs", loop.__name__, delay)
            await asyncio.sleep(delay)
            ceiling = RESTART_BACKOFF.grow(ceiling)


async def stop(state: ShufflerState) -> None:
    """Stop the loops, answer the calls still waiting for a commit (UNAVAILABLE), save the counters, close the
    log and release the state directory."""
    state.metrics.endpoint.close()
    await state.storage.stop()
    for t in state.tasks:
        t.cancel()
    await asyncio.gather(*state.tasks, return_exceptions=True)
    for _, _, fut, _, _ in state.pending:
        if not fut.done():
            fut.set_result(Unavailable("shuffler is shutting down; retry", error_reason=ErrorReason.NOTHING_STORED))
    state.pending, state.pending_bytes = [], 0
    with suppress(StorageFailed):
        await state.store.run(state.reportlog.save_counters)
    with suppress(StorageFailed):
        await state.store.run(state.reportlog.close)
    state.store.shutdown()
    state.state_lock.release()
