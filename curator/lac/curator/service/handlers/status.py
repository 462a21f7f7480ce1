"""GetStatus, GetBudget and GetDeployment: the operator's exact counts, the ledger's budget per window and the
published deployment."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lac.common.deployment import Deployment
from lac.common.privacy import Budget
from lac.curator.service.handlers import exports

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState


@dataclass(frozen=True)
class Status:
    """The operator's view (exact, un-noised counts: operators only)."""

    batches: int
    reports: int
    releases: int
    quarantined: int
    rejects: dict[str, int]
    reports_by_window: dict[int, int]
    budget: Budget
    spent: dict[int, Budget]
    replay_window_days: float


@dataclass(frozen=True)
class BudgetStatus:
    """Each window's budget (``spent``: see ``spent``), the exports (``CuratorStore.exports``) and the privacy unit."""

    budget: Budget
    spent: dict[int, Budget]
    exports: list[tuple[str, str, float, int, int, int]]
    window_seconds: float
    reports_per_window: int


async def spent(state: CuratorState) -> dict[int, Budget]:
    """Budget spent per window, for every window with spending or between the first and the last that hold
    reports (that span is disclosed un-noised: public information, README "Privacy, as implemented today")."""
    span = await state.store_thread.run(state.store.windows)
    spent = await state.store_thread.run(state.store.spent)
    if span is not None and span[1] - span[0] < 10_000:
        for w in range(span[0], span[1] + 1):
            spent.setdefault(w, Budget(0.0))
    return spent


async def releases_by_mechanism(state: CuratorState) -> dict[tuple[str, bool], int]:
    """The number of stored releases per (mechanism, differentially private)."""
    return await state.store_thread.run(state.store.releases_by_mechanism)


async def status(state: CuratorState) -> Status:
    """The operator's view: exact counts, rejects by reason, reports per window, the budget spent."""
    counts = await state.store_thread.run(state.store.counts)
    rejects = await state.store_thread.run(state.store.rejects)
    by_window = await state.store_thread.run(state.store.reports_by_window)
    return Status(
        **counts,
        rejects=rejects,
        reports_by_window=by_window,
        budget=state.budget,
        spent=await spent(state),
        replay_window_days=state.config.replay_window_days,
    )


async def budget(state: CuratorState) -> BudgetStatus:
    """The budget of each window (spent and left) and the exports of privatized reports."""
    d = state.deployment
    made = await exports.exports(state)
    return BudgetStatus(state.budget, await spent(state), made, d.window_seconds, d.reports_per_window)


def deployment(state: CuratorState) -> Deployment:
    """The published deployment, with the key ring's ids, the current key first: the SDK seals to none other."""
    ring = state.keyring
    key_ids = (ring.current, *(k for k in ring.key_ids if k != ring.current)) if ring else ()
    return dataclasses.replace(state.deployment, key_ids=key_ids)
