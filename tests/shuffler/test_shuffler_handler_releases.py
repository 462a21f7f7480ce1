"""The releases handler (``lac.shuffler.releases``: Flush, the threshold's release, the release lease) over a state
in a temporary directory, without gRPC: a real SQLite report log, its commit loop running."""

from __future__ import annotations

import asyncio

from shuffler_testkit import handler_state, submission

from lac.shuffler import intake, releases

LOOPS = (intake.commit_loop,)


async def _from_clients(state, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        await intake.submit(state, submission(1), f"token:c{i}")


def test_a_flush_below_the_threshold_releases_nothing_and_says_why(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=5) as state:
            await _from_clients(state, 4)
            return await releases.flush(state), state.buffered(), await state.batches_pending()

    result, buffered, pending = asyncio.run(main())
    assert not result.released and result.batch_id is None and result.batch_size == 0
    assert "reports of 4 distinct clients buffered, fewer than min_batch=5: carried over" in result.note
    assert buffered == 4 and pending == 0


def test_the_threshold_releases_one_batch_of_distinct_clients(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", (*LOOPS, releases.lease_loop), min_batch=5) as state:
            for _ in range(100):  # the lease loop takes the release lease (a SQLite shuffler's at once)
                if state.lease.held:
                    break
                await asyncio.sleep(0.05)
            await _from_clients(state, 5)  # the commit after the fifth releases
            for _ in range(100):
                if await state.batches_pending():
                    break
                await asyncio.sleep(0.05)
            note = state.note
            flushed = await releases.flush(state)  # nothing left to release
            return state.buffered(), await state.batches_pending(), note, flushed, state.lease.held

    buffered, pending, note, flushed, held = asyncio.run(main())
    assert buffered == 0 and pending == 1 and held
    assert "threshold: released batch" in note and "of 5 reports" in note
    assert not flushed.released


def test_a_flush_releases_what_reached_the_threshold_and_keeps_a_reserve_back(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", LOOPS, min_batch=3, keep_reserve=True) as state:
            await _from_clients(state, 5)  # 5 < 2 x 3: the commit keeps them all for a batch and a reserve
            waiting = state.buffered()
            flushed = await releases.flush(state)  # the operator's flush releases without a reserve
            return waiting, flushed, state.buffered()

    waiting, flushed, left = asyncio.run(main())
    assert waiting == 5
    assert flushed.released and flushed.batch_size == 5 and left == 0
    assert flushed.note.startswith(f"flush: released batch {flushed.batch_id} of 5 reports")
