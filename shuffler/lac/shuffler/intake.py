"""Submit and SubmitStream: refuse what this replica must not take, queue the rest for one durable group commit
and answer stored/duplicate per report; the commit loop that drains the queue.

Concurrent Submit calls queue their reports; one commit task drains the whole queue into a single fsync'd
transaction and then acknowledges every call in it (group commit). A report is acknowledged only after its
commit, so no acknowledged report is lost. The privacy unit is one client over an accounting window: a client may
store at most ``reports_per_window`` reports per window (and contribute to at most
``max_windows_per_client_per_period`` windows of a period), checked in the commit's transaction.

Sharded replicas refuse another replica's client before looking at its reports (``lac.shuffler.shards``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lac.common import tracing
from lac.common.envelope import PayloadRejected
from lac.common.errors import ErrorReason, InvalidArgument, RejectReason, ResourceExhausted, Unavailable
from lac.common.storage import StorageFailed
from lac.shuffler.releases import release_on_threshold
from lac.shuffler.reportlog import LOG_FULL, OVER_PERIOD_CAP, OVER_QUOTA
from lac.shuffler.serde import Submission
from lac.shuffler.shards import check_shard
from lac.shuffler.state import MISMATCH_RECHECK_SECONDS

if TYPE_CHECKING:
    from lac.shuffler.state import ShufflerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acknowledged:
    """A Submit message's answer: stored (True) or a duplicate (False) per report, in order."""

    submission: Submission
    stored: tuple[bool, ...]


async def submit(
    state: ShufflerState, submission: Submission, client_id: str | None = None, shards_digest: str | None = None
) -> Acknowledged:
    """Validate, store durably (group commit), return stored/duplicate per report.

    ``client_id`` is the authenticated client (None: anonymous, authentication disabled); a
    sharded replica refuses a client it does not serve, or one routed by another shard list
    (``shards_digest``, as the client sent it), before anything else (``check_shard``).
    """
    t0 = time.perf_counter()
    cfg = state.config
    check_shard(state, client_id, submission.count, shards_digest)
    if submission.invalid is not None:
        exc = submission.invalid
        reason = exc.reason if isinstance(exc, PayloadRejected) else RejectReason.INVALID_ARGUMENT
        state.count_reject(reason)
        exc.extra.setdefault("reason", reason)  # logged as reject_reason (lac.common.rpc)
        raise exc
    items = list(submission.items)
    if state.mismatch:
        state.count_reject(RejectReason.DEPLOYMENT_MISMATCH, len(items))
        raise Unavailable(
            f"this shuffler acknowledges no report until its operator fixes its configuration ({state.mismatch}); "
            f"nothing was stored: retry later",
            retry_after=MISMATCH_RECHECK_SECONDS,
            reason=RejectReason.DEPLOYMENT_MISMATCH,
        )
    if not state.storage.ok:
        state.count_reject(RejectReason.STORAGE_UNAVAILABLE, len(items))
        refusal = state.storage.unavailable()
        refusal.error_reason = ErrorReason.NOTHING_STORED
        raise refusal
    size = sum(len(it[2]) for it in items)
    if state.pending_bytes and state.pending_bytes + size > cfg.max_pending_bytes:
        state.count_reject(RejectReason.OVERLOADED, len(items))
        raise Unavailable(
            f"ingest queue full ({state.pending_bytes} bytes wait for a durable commit; "
            f"max_pending_bytes={cfg.max_pending_bytes}); retry",
            retry_after=1,
            reason=RejectReason.OVERLOADED,
            error_reason=ErrorReason.NOTHING_STORED,
        )
    key = state.reportlog.client_key(client_id) if client_id is not None else None
    fut = asyncio.get_running_loop().create_future()
    state.pending.append((items, key, fut, t0, size))
    state.pending_bytes += size
    state.wake_committer.set()
    try:
        # shield: a call that gives up leaves its reports in the commit (a retry is then a duplicate)
        result = await asyncio.wait_for(asyncio.shield(fut), cfg.commit_timeout_seconds)
    except TimeoutError:
        state.storage.stalled("group commit")  # health is NOT_SERVING before this caller hears UNAVAILABLE
        raise Unavailable(
            f"the durable commit did not finish within commit_timeout_seconds="
            f"{cfg.commit_timeout_seconds:g}; the reports may or may not be stored: retry with "
            f"the same idempotency ids",
            retry_after=state.storage.delay,
        ) from None
    if isinstance(result, Exception):
        raise result
    tracing.set_attributes({"lac.reports": len(items)})
    _refuse_over_limits(state, result)
    return Acknowledged(submission, tuple(result))


def _refuse_over_limits(state: ShufflerState, result) -> None:
    """Raise the refusal of a commit that stored nothing: over the quota, over the period cap, or the log full."""
    cfg = state.config
    if result == OVER_QUOTA:
        wait = state.seconds_to_next_window()
        raise ResourceExhausted(
            f"quota of {cfg.reports_per_window} report(s) per client per accounting "
            f"window reached; retry after {wait:.0f} s (next window)",
            retry_after=wait,
            reason=RejectReason.QUOTA,
        )
    if result == OVER_PERIOD_CAP:
        cap, period = cfg.max_windows_per_client_per_period, state.period
        wait = ((state.window() // period + 1) * period) * cfg.window_seconds - time.time()
        raise ResourceExhausted(
            f"this client contributed to {cap} accounting window(s) of the current period of {period} "
            f"window(s) already, the most the deployment allows (max_windows_per_client_per_period); retry "
            f"after {wait:.0f} s (next period)",
            retry_after=wait,
            reason=RejectReason.PERIOD_CAP,
        )
    if result == LOG_FULL:
        raise Unavailable(
            f"report log full ({state.reportlog.used_bytes} of {cfg.max_log_bytes} bytes): "
            "the curator is not taking batches; retry later",
            retry_after=30,
            reason=RejectReason.LOG_FULL,
            error_reason=ErrorReason.NOTHING_STORED,
        )


async def submit_stream(
    state: ShufflerState,
    submissions: AsyncIterator[Submission],
    client_id: str | None = None,
    shards_digest: str | None = None,
) -> tuple[Acknowledged, ...]:
    """SubmitStream: each message's reports as one ``submit``, at most ``max_reports_per_request`` in the whole
    call (the one response carries an ack per report)."""
    acks: list[Acknowledged] = []
    total, limit = 0, state.config.max_reports_per_request
    async for submission in submissions:
        total += submission.count
        if total > limit:  # the one response carries an ack per report: bound the whole call
            state.count_reject(RejectReason.INVALID_ARGUMENT, submission.count)
            raise InvalidArgument(
                f"more than {limit} reports in one SubmitStream call (max_reports_per_request); "
                f"the earlier messages' reports may be stored: resend them in a new call "
                f"with the same idempotency ids"
            )
        acks.append(await submit(state, submission, client_id, shards_digest))
    return tuple(acks)


def _commit_groups(state: ShufflerState, groups, window: int) -> list:
    state.check_space()
    cfg = state.config
    cap = cfg.max_windows_per_client_per_period
    return state.reportlog.append_groups(groups, window, cfg.reports_per_window, cfg.max_log_bytes, cap, state.period)


async def commit_loop(state: ShufflerState) -> None:
    """Drain the queue of Submit calls into one group commit at a time, answer each call, release at the
    threshold."""
    while True:
        await state.wake_committer.wait()
        state.wake_committer.clear()
        batch, state.pending = state.pending, []
        if not batch:
            continue
        try:
            results = await _commit(state, batch)
        finally:
            state.pending_bytes -= sum(b[4] for b in batch)
        now = time.perf_counter()
        for (_, _, fut, t0, _), r in zip(batch, results):
            state.metrics.ingest_seconds.observe(now - t0)
            if not fut.done():
                fut.set_result(r)  # an exception is passed as a value: a caller gone since leaves no warning
        with suppress(StorageFailed):  # already logged; released after the recovery
            await release_on_threshold(state)


async def _commit(state: ShufflerState, batch: list) -> list:
    """One group commit of ``batch``: a result or an exception per call. A commit that takes longer
    than commit_timeout_seconds marks the storage as stalled (its callers have given up by then)."""
    try:
        return await state.store.run(_commit_groups, state, [(b[0], b[1]) for b in batch], state.window())
    except StorageFailed:
        return [state.storage.unavailable() for _ in batch]
    except Exception:
        log.exception("group commit failed")
        return [Unavailable("report log write failed; retry later", retry_after=1) for _ in batch]
