"""IngestBatch: idempotent batch ingest with quarantine and a replay window.

* A batch is identified by its ``batch_id``: a redelivered batch is acknowledged as a duplicate
  and stored once.
* Every payload is opened, validated and counted by ``lac.curator.ingest.chunks`` on ``ingest_workers``
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
* Storage failures (full disk, I/O errors, free space below ``min_free_disk_bytes``) go through
  ``lac.common.storage.StorageGuard``: one log line, gRPC health NOT_SERVING, IngestBatch and
  Release answer UNAVAILABLE with ``retry-after-seconds`` at once, and test writes restore
  SERVING when space returns. A batch is stored in one transaction or not at all.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from lac.common import tracing
from lac.common.deployment import windows_in_period
from lac.common.errors import FailedPrecondition, InvalidArgument
from lac.curator.ingest.chunks import IngestBatch, merge_counts
from lac.curator.service.state import MAX_CLOCK_SKEW_SECONDS

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ingested:
    """What became of a batch: a duplicate of one stored before, or how many of its reports were stored."""

    batch_id: str
    duplicate: bool = False
    accepted: int = 0
    rejected: int = 0


def batch_windows(state: CuratorState, batch: IngestBatch) -> tuple[int, int]:
    """The accounting windows of a batch's reports, after checking the shuffler's privacy unit."""
    d = state.deployment
    if batch.privacy is None:
        if not state.config.insecure:
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
    if not p.distinct_clients and not state.config.insecure:
        raise FailedPrecondition(
            "the batch's reports are not bound to distinct clients (the shuffler runs without "
            "client authentication); this curator's user-level accounting needs them to be"
        )
    newest = state.newest_window()
    if not 0 <= p.first_window <= p.last_window <= newest:
        raise InvalidArgument(
            f"batch privacy: windows {p.first_window}..{p.last_window} must satisfy 0 <= first "
            f"<= last <= {newest} (the current window; the shuffler's clock may be ahead by "
            f"{MAX_CLOCK_SKEW_SECONDS:g} s)"
        )
    return p.first_window, p.last_window


async def ingest(state: CuratorState, batch: IngestBatch) -> Ingested:
    """Open, count and store one batch from the shuffler (once: a batch id seen before is a duplicate)."""
    if not batch.batch_id or len(batch.batch_id) > 128:
        raise InvalidArgument("batch_id must be 1..128 characters")
    state.storage.check()  # failing storage: UNAVAILABLE at once, the shuffler keeps the batch and retries
    tracing.set_attributes({"lac.batch_id": batch.batch_id, "lac.reports": len(batch.payloads)})
    if await state.store_thread.run(state.store.has_batch, batch.batch_id):
        tracing.set_attributes({"lac.duplicate": True})
        return Ingested(batch.batch_id, duplicate=True)
    windows = batch_windows(state, batch)
    await state.store_thread.run(
        state.store.check_not_exported, batch.batch_id, windows[1]
    )  # fail fast; re-checked on store
    chunks = await state.ingest.count(batch.payloads)  # on ingest_workers processes; Unavailable if one died
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
    window = state.config.replay_window_days * 86400.0
    privacy = batch.privacy.encoded if batch.privacy is not None else None
    result = await state.store_thread.run(
        partial(
            state.store.add_batch,
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
        return Ingested(batch.batch_id, duplicate=True)
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
    return Ingested(batch.batch_id, accepted=result.accepted, rejected=result.rejected)
