"""The forward handler's parts that need no curator (``lac.shuffler.forward``: the deployment a shuffler relays,
the operator's dead letters) over a state in a temporary directory, without gRPC; delivery itself, a gRPC client
of the curator, is tested against a real curator (test_shuffler.py, tests/system)."""

from __future__ import annotations

import asyncio

import pytest
from shuffler_testkit import handler_state, submission

from lac.common.deployment import Deployment
from lac.common.errors import InvalidArgument, NotFound, Unavailable
from lac.shuffler import forward, intake, releases


def test_the_deployment_is_unavailable_until_the_curators_is_known(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s") as state:
            with pytest.raises(Unavailable, match="not known yet"):
                forward.known_deployment(state)
            state.deployment = Deployment()
            return forward.known_deployment(state)

    assert asyncio.run(main()) == Deployment()


def test_dead_letters_are_listed_retried_and_dropped(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", (intake.commit_loop,), min_batch=2) as state:
            for i in range(4):
                await intake.submit(state, submission(1), f"token:c{i}")
                if i % 2:
                    await releases.flush(state)
            first, second = await state.store.run(state.reportlog.pending_batches)
            for batch_id in (first, second):  # as the forwarder sets aside a batch the curator refused for good
                await state.store.durably(state.reportlog.dead_letter, batch_id, "INVALID_ARGUMENT: test")
            letters = await forward.dead_letters(state)
            with pytest.raises(InvalidArgument, match="not both"):
                await forward.settle_dead_letters(state, [first], every=True, drop=False)
            with pytest.raises(NotFound, match="not dead letters of this shuffler: 'nope'"):
                await forward.settle_dead_letters(state, ["nope"], every=False, drop=False)
            retried = await forward.settle_dead_letters(state, [first], every=False, drop=False)
            dropped = await forward.settle_dead_letters(state, [], every=True, drop=True)
            return (first, second), letters, retried, dropped, await state.batches_pending(), state.wake_forwarder

    ids, letters, retried, dropped, pending, woken = asyncio.run(main())
    assert [d.batch_id for d in letters] == list(ids) and all(d.size == 2 for d in letters)
    assert letters[0].refusal == "INVALID_ARGUMENT: test" and letters[0].dead_since_unix > 0
    assert retried == forward.Settled((ids[0],), 2) and woken.is_set()  # pending again: the forwarder is woken
    assert dropped == forward.Settled((ids[1],), 2) and pending == 1
