"""The privacy ledger's rule (``lac.curator.store.ledger``): a budget per accounting window, basic composition within
it, and a refusal that names the windows over it in public quantities only."""

from __future__ import annotations

import pytest

from lac.common.errors import ErrorReason, FailedPrecondition
from lac.common.privacy import Budget
from lac.curator.store.ledger import refuse_overspending

LIMIT = Budget(1.0, 1e-6)


def test_a_charge_that_fits_every_window_passes():
    refuse_overspending({}, Budget(1.0, 1e-6), LIMIT)  # exactly the budget
    refuse_overspending({3: Budget(0.25, 0.0), 4: Budget(0.5, 5e-7)}, Budget(0.5, 5e-7), LIMIT)


def test_a_charge_over_the_budget_in_any_window_is_refused_naming_it():
    spent = {3: Budget(0.25), 4: Budget(0.75), 5: Budget(0.0, 1e-6)}
    with pytest.raises(FailedPrecondition) as refused:
        refuse_overspending(spent, Budget(0.5, 1e-9), LIMIT)
    message = str(refused.value)
    assert refused.value.error_reason == ErrorReason.BUDGET_EXHAUSTED
    assert "window 4: spent" in message and "window 5: spent" in message  # ε over in 4, δ over in 5
    assert "window 3" not in message


def test_a_refusal_over_many_windows_names_five_and_counts_the_rest():
    spent = {w: Budget(1.0) for w in range(12)}
    with pytest.raises(FailedPrecondition) as refused:
        refuse_overspending(spent, Budget(0.1), LIMIT)
    message = str(refused.value)
    assert message.count("window ") == 5 + 1  # five named, and "in each window it covers"
    assert message.endswith("and 7 more")
