"""The release family's handlers (``lac.curator.service.handlers.release``: Release, PreviewRelease, ListReleases,
GetRelease) over a curator's state, without gRPC: a release charges every window it covers once, however often it
is retried; a preview predicts that charge and spends nothing; the ledger refuses what the budget cannot pay."""

from __future__ import annotations

import pytest
from curator_testkit import ingest_batch, on_state

from lac.common.errors import AlreadyExists, ErrorReason, FailedPrecondition, NotFound
from lac.common.privacy import Budget
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.service.handlers import ingest, release, status

SENTENCES = [["the", "dog", "sleeps", "in", "the", "sun"], ["a", "fox", "is", "a", "small", "animal"]] * 5
LAPLACE = ReleaseSpec(epsilon=1.0, mechanism="laplace", force=True)


async def _with_reports(state) -> int:
    """Store one batch; the window it is in."""
    batch = ingest_batch(SENTENCES)
    await ingest.ingest(state, batch)
    return int(batch.privacy.last_window)


def test_a_release_charges_its_windows_once_however_often_it_is_retried(tmp_path, public_corpus):
    async def run(state):
        window = await _with_reports(state)
        first = await release.release(state, LAPLACE, request_id="r-1")
        again = await release.release(state, LAPLACE, request_id="r-1")
        with pytest.raises(AlreadyExists):  # the same id for other parameters
            await release.release(state, ReleaseSpec(epsilon=2.0, mechanism="laplace", force=True), request_id="r-1")
        spent = await status.spent(state)
        return window, first, again, spent, await release.list_releases(state)

    window, first, again, spent, listed = on_state(tmp_path, public_corpus, run)
    assert again.release_id == first.release_id
    assert first.differentially_private and (first.first_window, first.last_window) == (window, window)
    assert spent == {window: Budget(1.0)}
    assert [r.release_id for r in listed] == [first.release_id]


def test_a_stored_release_holds_its_items_and_values(tmp_path, public_corpus):
    async def run(state):
        await _with_reports(state)
        made = await release.release(state, LAPLACE)
        return made, await release.get_release(state, made.release_id)

    made, found = on_state(tmp_path, public_corpus, run)
    assert found.record.release_id == made.release_id
    assert len(found.items) == len(found.log_probs) > 0 and found.errors is not None


def test_a_preview_predicts_the_charge_and_spends_nothing(tmp_path, public_corpus):
    async def run(state):
        window = await _with_reports(state)
        await release.release(state, LAPLACE)
        seen = await release.preview(state, ReleaseSpec(epsilon=2.0, mechanism="laplace"), operator=True)
        return window, seen, await status.spent(state)

    window, seen, spent = on_state(tmp_path, public_corpus, run)
    assert spent == {window: Budget(1.0)}  # what the release spent, not the preview
    ((w, eps, delta, eps_left, _),) = seen.budget_after
    assert (w, delta) == (window, 0.0)
    assert eps == pytest.approx(3.0, rel=1e-12) and eps_left == pytest.approx(10.0 - 3.0, rel=1e-12)
    assert seen.reports == len(SENTENCES) and seen.reports_source == "stored, exact (operator view)"


def test_the_budget_refuses_a_release_it_cannot_pay(tmp_path, public_corpus):
    async def run(state):
        await _with_reports(state)
        with pytest.raises(FailedPrecondition) as refused:
            await release.release(state, ReleaseSpec(epsilon=3.0, mechanism="laplace", force=True))
        return refused.value, await status.spent(state), await release.list_releases(state)

    refused, spent, listed = on_state(tmp_path, public_corpus, run, budget_epsilon=2.0)
    assert refused.error_reason == ErrorReason.BUDGET_EXHAUSTED and "privacy budget exhausted" in str(refused)
    assert all(b == Budget(0.0) for b in spent.values()) and listed == []


def test_unknown_and_disabled_releases_are_refused(tmp_path, public_corpus):
    async def run(state):
        await _with_reports(state)
        with pytest.raises(NotFound):
            await release.get_release(state, "no-such-release")
        with pytest.raises(FailedPrecondition) as dd:
            spec = ReleaseSpec(epsilon=1.0, mechanism="bayesian", sensitivity="bruteforce", force=True)
            await release.release(state, spec)
        return dd.value

    dd = on_state(tmp_path, public_corpus, run)
    assert "NOT differentially private and are disabled" in str(dd)
