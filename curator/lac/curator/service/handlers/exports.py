"""ExportReports (and the list of exports GetBudget and the releases show): the privatized reports of settled
windows, recorded with the ledger before any row is sent; local DP only, never charged."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lac.common.errors import FailedPrecondition, InvalidArgument
from lac.common.exports import guarantee_json
from lac.common.privacy import LocalGuarantee
from lac.common.rng import secure_generator
from lac.common.rpc import Role
from lac.curator.store import export

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Export:
    """An export made: its id, its guarantee and its rows (close them when done)."""

    export_id: str
    guarantee: LocalGuarantee
    rows: export.ShuffledReports


async def export_reports(
    state: CuratorState, first_window: int, last_window: int, identity: str | None, roles: frozenset[Role]
) -> Export:
    """Export the privatized reports of the settled windows ``first_window``..``last_window`` (each batch
    belongs to its last window; ``lac.curator.store.export``): its id, its guarantee and the rows in a fresh
    uniformly random order (close them when done). The export is recorded with the ledger (``identity``, the time,
    the windows, the rows) before this returns, so before any row is sent, and from then on a batch of those
    windows is refused; it charges nothing."""
    export.check_grant(state.config.roles[Role.EXPORT], roles)
    export.check_windows(first_window, last_window, state.deployment, settle_seconds=state.config.settle_seconds)
    async with state.words_lock:  # no purge deletes a words file while this reads it
        batches = await state.store_thread.run(state.store.export_batches, first_window, last_window)
        if not batches:
            raise InvalidArgument(f"no reports are stored in windows {first_window}..{last_window}")
        without = sum(w is None for *_, w in batches)
        if without:
            raise FailedPrecondition(
                f"the words of {without} of the {len(batches)} batches of windows {first_window}..{last_window} "
                f"are not kept (export was off when they arrived, export_retention_days = "
                f"{state.config.export_retention_days:g} passed since their window closed, or they were restored "
                f"from a backup, which holds no words): these windows cannot be exported"
            )
        paths = [state.store.words_dir / w for *_, w in batches if w is not None]
        rng = state.rng if state.rng is not None else secure_generator()
        expected = sum(n for _, _, n, _, _ in batches)
        rows = await asyncio.to_thread(
            export.ShuffledReports, paths, rng, expected, state.config.state_dir / export.SPOOL_DIR
        )
    try:
        shuffles = export.window_shuffles([b[:4] for b in batches], first_window, last_window, state.deployment)
        guarantee = export.local_guarantee(state.deployment, first_window, last_window, rows.rows, shuffles)
        export_id = uuid.uuid4().hex
        who = identity.removeprefix("mtls:") if identity else ""
        await state.store_thread.run(
            state.store.add_export,
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
    return Export(export_id, guarantee, rows)


async def exports(state: CuratorState) -> list[tuple[str, str, float, int, int, int]]:
    """Every export of privatized reports, oldest first (``CuratorStore.exports``)."""
    return await state.store_thread.run(state.store.exports)


async def chunks(made: Export) -> AsyncIterator[bytes]:
    """The export's rows as Arrow IPC chunks, read off the event loop (the caller closes the rows)."""
    rows = made.rows.chunks()
    while (data := await asyncio.to_thread(export.next_ipc, rows)) is not None:
        yield data
