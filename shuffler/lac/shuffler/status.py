"""GetStatus: the operator's view of one shuffler (buffered reports, batches, rejects, storage, lease, notes).

Operator-only: it carries exact counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lac.shuffler.state import ShufflerState


@dataclass(frozen=True)
class BatchInfo:
    """A recent batch: its size, whether the curator acknowledged it, its statement (serialized), its refusal."""

    batch_id: str
    size: int
    delivered: bool
    privacy: bytes
    refusal: str


@dataclass(frozen=True)
class Status:
    """What ``GetStatus`` answers: the fields of ``lac.v1.ShufflerStatus`` by name (``serde.status_reply``)."""

    buffered_reports: int
    buffered_clients: int
    min_batch: int
    batches_forwarded: int
    reports_forwarded: int
    batches_pending: int
    rejects: dict[str, int]
    note: str
    window: int
    seconds_to_next_window: float
    log_bytes: int
    max_log_bytes: int
    counters: dict[str, int]
    recent_batches: tuple[BatchInfo, ...]
    auth: str
    batches_dead_letter: int
    deployment_mismatch: str
    release_lease: bool


async def status(state: ShufflerState) -> Status:
    """The shuffler's status, read from the report log (recounted from a shared database first)."""
    await state.recount()
    counters = await state.counters()
    pending = await state.store.run(state.reportlog.pending_batches)
    dead = await state.store.run(state.reportlog.dead_letters)
    recent = await state.store.run(state.reportlog.recent_batches)
    cfg = state.config
    notes = [
        f"STORAGE FAILING: {state.storage.error}; " if state.storage.error else "",
        f"MISCONFIGURED: {state.mismatch}; " if state.mismatch else "",
        f"{len(dead)} dead letter(s): lac shuffler dead-letter list; " if dead else "",
    ]
    return Status(
        buffered_reports=state.reportlog.buffered(),
        buffered_clients=state.reportlog.takeable(),
        min_batch=cfg.min_batch,
        batches_forwarded=counters.get("batches_forwarded", 0),
        reports_forwarded=counters.get("reports_forwarded", 0),
        batches_pending=len(pending),
        rejects={k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("reject:")},
        note="".join(notes) + state.note,
        window=state.window(),
        seconds_to_next_window=state.seconds_to_next_window(),
        log_bytes=state.reportlog.used_bytes,
        max_log_bytes=cfg.max_log_bytes,
        counters={k: v for k, v in counters.items() if not k.startswith("reject:")},
        recent_batches=tuple(BatchInfo(b, n, bool(d), p or b"", dead or "") for b, n, d, p, dead in recent),
        auth="token" if state.auth.enabled else "none (INSECURE)",
        batches_dead_letter=len(dead),
        deployment_mismatch=state.mismatch,
        release_lease=state.lease.held,
    )
