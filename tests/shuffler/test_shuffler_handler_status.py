"""The status handler (``lac.shuffler.status``: GetStatus) over a state in a temporary directory, without gRPC."""

from __future__ import annotations

import asyncio

from shuffler_testkit import handler_state, submission

from lac.common.deployment import Deployment
from lac.shuffler import intake, releases, status


def test_the_status_counts_what_the_log_holds_and_says_what_is_wrong(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s", (intake.commit_loop,), min_batch=2) as state:
            empty = await status.status(state)
            for i in range(3):
                await intake.submit(state, submission(1), f"token:c{i}")
            await releases.flush(state)
            state.note_mismatch(Deployment(reports_per_window=2))
            return empty, await status.status(state)

    empty, s = asyncio.run(main())
    assert empty.buffered_reports == 0 and empty.recent_batches == () and empty.auth == "none (INSECURE)"
    assert s.counters["accepted"] == 3 and s.batches_pending == 1 and s.batches_forwarded == 0
    (batch,) = s.recent_batches
    assert batch.size in (2, 3) and not batch.delivered and batch.privacy == b"" and batch.refusal == ""
    assert s.buffered_reports == 3 - batch.size and s.min_batch == 2 and s.release_lease
    assert s.note.startswith("MISCONFIGURED: its quota is 1 report(s)") and s.deployment_mismatch in s.note
