"""The privacy ledger's rule: a budget per accounting window, basic composition within it.

The privacy unit is one client over an accounting window. A release covering windows
w₁..w₂ protects each client's whole contribution to those windows at its (ε, δ), so it spends
(ε, δ) from the budget of every window it covers; the total privacy loss of any one window's
data is then the sum over the releases covering it, and a release is refused if that sum
would exceed the per-window budget in any window. Persistence lives in
``lac.curator.store.store``; this module is the rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from lac.common.errors import ErrorReason, FailedPrecondition
from lac.common.privacy import Budget

__all__ = ["refuse_overspending"]


def refuse_overspending(spent: Mapping[int, Budget], charge: Budget, limit: Budget) -> None:
    """FailedPrecondition (``ErrorReason.BUDGET_EXHAUSTED``) naming the windows where ``spent + charge``
    would exceed ``limit``.

    The message holds only public quantities: the request, the per-window budget and what
    earlier releases (public requests) spent.
    """
    over = sorted(w for w, b in spent.items() if not (b + charge).fits(limit))
    if not over:
        return
    shown = ", ".join(f"window {w}: spent {spent[w]}, remaining {limit.minus(spent[w])}" for w in over[:5])
    more = f" and {len(over) - 5} more" if len(over) > 5 else ""
    raise FailedPrecondition(
        f"privacy budget exhausted: this release would spend {charge} in each window it "
        f"covers; the budget is {limit} per window; over it in {shown}{more}",
        error_reason=ErrorReason.BUDGET_EXHAUSTED,
    )
