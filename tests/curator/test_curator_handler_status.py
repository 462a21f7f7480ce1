"""The status handlers (``lac.curator.service.handlers.status``: GetStatus, GetBudget, GetDeployment) over a
curator's state, without gRPC: exact counts for the operator, each window's budget from the ledger, the published
deployment with the key ring's ids."""

from __future__ import annotations

import dataclasses

from curator_testkit import ingest_batch, on_state

from lac.common.envelope import CuratorKeyRing
from lac.common.privacy import Budget
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.service.handlers import ingest, release, status

SENTENCES = [["the", "dog", "sleeps"], ["a", "fox", "is", "a", "small", "animal"]]


def test_status_and_budget_follow_the_store_and_the_ledger(tmp_path, public_corpus):
    async def run(state):
        empty = await status.status(state)
        batch = ingest_batch(SENTENCES)
        await ingest.ingest(state, batch)
        await ingest.ingest(state, ingest_batch(SENTENCES, window=batch.privacy.last_window - 3))
        await release.release(state, ReleaseSpec(epsilon=0.5, mechanism="laplace", force=True))
        return int(batch.privacy.last_window), empty, await status.status(state), await status.budget(state)

    window, empty, now, budget = on_state(tmp_path, public_corpus, run, budget_epsilon=4.0)
    assert (empty.batches, empty.reports, empty.releases, empty.spent) == (0, 0, 0, {})
    assert (now.batches, now.reports, now.releases, now.quarantined) == (2, 4, 1, 0)
    assert now.reports_by_window == {window - 3: 2, window: 2}
    # the release covered every window from the first with reports to the last (those between too): each is charged
    assert now.spent == budget.spent == {w: Budget(0.5) for w in range(window - 3, window + 1)}
    assert now.budget == budget.budget == Budget(4.0, now.budget.delta)
    assert budget.exports == [] and (budget.window_seconds, budget.reports_per_window) == (86400.0, 1)


def test_the_deployment_names_the_current_key_first(tmp_path, public_corpus, curator_key_dir):
    ring = CuratorKeyRing.load(curator_key_dir)
    published = on_state(tmp_path, public_corpus, _deployment, key_dir=curator_key_dir)
    assert published.key_ids[0] == ring.current and set(published.key_ids) == set(ring.key_ids)
    assert dataclasses.replace(published, key_ids=()) == dataclasses.replace(
        on_state(tmp_path / "b", public_corpus, _deployment), key_ids=()
    )


async def _deployment(state):
    return status.deployment(state)
