"""The intake handler (``lac.shuffler.intake``: Submit, SubmitStream, the group commit) over a state in a temporary
directory, without gRPC: a real SQLite report log, its commit loop running."""

from __future__ import annotations

import asyncio

import pytest
from shuffler_testkit import handler_state, submission

from lac.common.deployment import Deployment
from lac.common.errors import InvalidArgument, RejectReason, ResourceExhausted, Unavailable
from lac.shuffler import intake
from lac.shuffler.serde import Submission

LOOPS = (intake.commit_loop,)


def test_a_submit_is_stored_once_and_its_retry_is_a_duplicate(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=1000, reports_per_window=3) as state:
            sent = submission(3)
            first = await intake.submit(state, sent, "token:alice")
            again = await intake.submit(state, sent, "token:alice")
            return first, again, state.buffered(), await state.counters()

    first, again, buffered, counters = asyncio.run(main())
    assert first.stored == (True, True, True) and first.submission.idempotency_ids == again.submission.idempotency_ids
    assert again.stored == (False, False, False)
    assert buffered == 3 and counters["accepted"] == 3 and counters["duplicates"] == 3


def test_concurrent_submits_share_one_group_commit(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=1000) as state:
            before = state.reportlog.commits
            acks = await asyncio.gather(*(intake.submit(state, submission(1), f"token:c{i}") for i in range(20)))
            return acks, state.reportlog.commits - before

    acks, commits = asyncio.run(main())
    assert all(a.stored == (True,) for a in acks)
    assert 1 <= commits < 20  # the first call's commit runs alone, the others queue behind it


def test_a_refused_message_is_counted_and_stores_nothing(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=1000) as state:
            bad = Submission(2, (b"x", b"y"), invalid=InvalidArgument("report 0: idempotency_id must be 8..64 bytes"))
            with pytest.raises(InvalidArgument, match="idempotency_id"):
                await intake.submit(state, bad, "token:alice")
            return state.buffered(), await state.counters()

    buffered, counters = asyncio.run(main())
    assert buffered == 0 and counters[f"reject:{RejectReason.INVALID_ARGUMENT}"] == 1


def test_the_quota_is_resource_exhausted_until_the_next_window(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=1000, reports_per_window=2) as state:
            await intake.submit(state, submission(2), "token:alice")
            with pytest.raises(ResourceExhausted, match="quota of 2 report") as refused:
                await intake.submit(state, submission(1), "token:alice")
            other = await intake.submit(state, submission(1), "token:bob")  # another client's own quota
            return refused.value, other

    refused, other = asyncio.run(main())
    assert refused.extra["reason"] == RejectReason.QUOTA and 0 < refused.retry_after <= 86400
    assert other.stored == (True,)


def test_a_stream_is_bounded_as_a_whole(tmp_path):
    async def main():
        async with handler_state(
            tmp_path / "s", LOOPS, min_batch=1000, max_reports_per_request=4, reports_per_window=6
        ) as state:

            async def messages():
                yield submission(3)
                yield submission(3)

            with pytest.raises(InvalidArgument, match="more than 4 reports in one SubmitStream call"):
                await intake.submit_stream(state, messages(), "token:alice")
            return state.buffered()

    assert asyncio.run(main()) == 3  # the first message's reports were stored before the second was refused


def test_a_shuffler_whose_unit_is_not_the_curators_refuses_every_report(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=1000) as state:
            state.note_mismatch(Deployment(reports_per_window=2))  # the shuffler's quota is 1 per window
            with pytest.raises(Unavailable, match="nothing was stored") as refused:
                await intake.submit(state, submission(2), "token:alice")
            return refused.value, state.buffered(), await state.counters(), state.health

    refused, buffered, counters, health = asyncio.run(main())
    assert refused.extra["reason"] == RejectReason.DEPLOYMENT_MISMATCH and buffered == 0
    assert counters[f"reject:{RejectReason.DEPLOYMENT_MISMATCH}"] == 2
