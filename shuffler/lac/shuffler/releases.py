"""Releases: one anonymised shuffled batch at the threshold, at the end of each release interval and on the
operator's Flush (never below the threshold); the release lease that makes one replica the one that releases.

Replicas over one PostgreSQL database (``store``): every replica takes any client's Submit, and the one holding the
release lease (``lac.shuffler.lease``) releases, forwards and prunes; it reads the buffered counts from the database
every ``CHECK_SECONDS``, and loses the lease, cancelling its deliveries, when its lease session ends. ``Flush`` on
another replica takes the lease if it is free, else answers UNAVAILABLE. A SQLite shuffler always holds it.

Batch ids are 128-bit values from the OS CSPRNG drawn per batch (``ReportLog.release``), so two batches, of one
replica or of two, share an id at the curator (which de-duplicates by batch id) only with probability below
n²/2^129 for n batches in all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lac.common.errors import Unavailable
from lac.common.storage import StorageFailed
from lac.shuffler.lease import CHECK_SECONDS, CHECK_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from lac.shuffler.state import ShufflerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlushResult:
    """What a release did: the batch released (``batch_id`` None: none) and the note saying why."""

    batch_id: str | None
    batch_size: int
    note: str

    @property
    def released(self) -> bool:
        """Whether a batch was released."""
        return self.batch_id is not None


async def flush(state: ShufflerState, why: str = "flush", reserve: int = 0) -> FlushResult:
    """Release one anonymised shuffled batch if the release threshold is reached (never below it),
    keeping a uniformly random ``reserve`` of the buffered clients' reports back.

    The threshold is min_batch plus, with ``batch_threshold_noise``, a secret random amount
    drawn anew after each release; it counts distinct clients among the buffered reports.
    """
    cfg = state.config
    if not state.lease.held and not await check_lease(state):
        raise Unavailable(
            "another shuffler replica over this report log's database holds the release lease and releases the "
            "batches (GetStatus's release_lease says which); flush there, or wait: it releases at the threshold "
            "and at the end of each release interval",
            retry_after=CHECK_SECONDS,
        )
    released = await state.store.run(
        state.reportlog.release, state.threshold, cfg.subsample_q, cfg.crowd_threshold, cfg.max_batch_bytes, reserve
    )
    if released is None:
        n = state.reportlog.takeable()
        bar = (
            f"min_batch={cfg.min_batch}"
            if not cfg.batch_threshold_noise
            else f"the randomised threshold (min_batch={cfg.min_batch} + secret noise)"
        )
        state.note = (
            f"{why} in window {state.window()}: reports of {n} distinct clients buffered, fewer than "
            f"{bar}: carried over"
        )
        return FlushResult(None, 0, state.note)
    state.threshold, state.next_threshold = state.next_threshold, state.draw_threshold()
    dropped = ""
    if released.dropped_subsampled or released.dropped_crowd:
        dropped = (
            f"; dropped {released.dropped_subsampled} by sub-sampling (q={cfg.subsample_q:g}) and "
            f"{released.dropped_crowd} by the crowd threshold (k={cfg.crowd_threshold})"
        )
    if released.batch_id is None:
        state.note = f"{why}: all {released.considered} taken reports were dropped{dropped}"
        return FlushResult(None, 0, state.note)
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
    left = state.reportlog.buffered()
    kept = "a reserve kept back for the next batch (keep_reserve) and " if reserve else ""
    state.note = (
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
    state.wake_forwarder.set()
    return FlushResult(released.batch_id, released.size, state.note)


async def release_on_threshold(state: ShufflerState) -> None:
    """After a commit (or a recovery): release if the threshold is reached, keeping the next threshold's
    worth of reports back with ``keep_reserve``."""
    reserve = state.next_threshold if state.config.keep_reserve else 0
    if state.lease.held and state.reportlog.takeable() >= state.threshold + reserve:
        await flush(state, "threshold", reserve)


async def interval_loop(state: ShufflerState) -> None:
    """At the end of each release interval: release what reached the threshold, prune the quota table and the
    idempotency ids (the lease holder's alone), save the counters."""
    interval = state.config.release_interval_seconds
    while True:
        await asyncio.sleep(interval - time.time() % interval + 0.001)
        if state.lease.held:  # the housekeeping too is the lease holder's alone
            await flush(state, "end of release interval")
            await state.store.run(state.reportlog.prune_quota, state.window(), state.period)
            await state.store.run(state.reportlog.rotate_seen, state.config.idempotency_window_days * 86400.0)
        await state.store.run(state.reportlog.save_counters)


async def lease_loop(state: ShufflerState) -> None:
    """Every ``CHECK_SECONDS``: the release lease's holder checks it, reads the buffered counts from a shared
    database (every replica stores reports into it) and releases at the threshold; the others try to take it."""
    while True:
        await check_lease(state)
        if state.lease.held:
            with suppress(StorageFailed):  # logged once by the StorageGuard; the lease is checked on meanwhile
                if state.reportlog.shared:
                    await state.store.run(state.reportlog.recount)
                await release_on_threshold(state)
        await asyncio.sleep(CHECK_SECONDS)


async def check_lease(state: ShufflerState) -> bool:
    """Check the release lease if this replica holds it, else try to take it; whether it holds it now. A lost
    lease cancels the deliveries in flight at once (the next holder sends those batches under the same ids)."""
    async with state.lease_lock:
        was = state.lease.held
        try:
            held = await asyncio.wait_for(
                asyncio.to_thread(state.lease.check if was else state.lease.acquire), CHECK_TIMEOUT_SECONDS
            )
        except TimeoutError:
            await asyncio.to_thread(state.lease.release)
            held = False
        if held and not was:
            log.info("this replica holds the release lease: it releases and forwards the batches")
            state.wake_forwarder.set()
        elif was and not held:
            log.warning(
                "RELEASE LEASE LOST (its database session ended or did not answer within %gs): no longer "
                "releasing or forwarding; %d deliveries in flight cancelled, another replica sends them again",
                CHECK_TIMEOUT_SECONDS,
                len(state.deliveries),
            )
            for task in state.deliveries.values():
                task.cancel()
        return held
