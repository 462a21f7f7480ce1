"""The shards handler (``lac.shuffler.shards``: GetShards, Submit's shard check) over a state in a temporary
directory, without gRPC."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from shuffler_testkit import handler_state

from lac.common.errors import RejectReason
from lac.shuffler import shards
from lac.shuffler.shards import ShardAssignment, ShardListMismatch, WrongShard, assign_shard, shards_digest

A, B = "127.0.0.1:7001", "127.0.0.1:7002"


def test_an_unsharded_shuffler_assigns_no_shard(tmp_path):
    async def main():
        async with handler_state(tmp_path / "s") as state:
            shards.check_shard(state, "token:alice", 1)  # takes every client
            return shards.assignment(state, "token:alice"), state.store_id

    got, store_id = asyncio.run(main())
    assert got == ShardAssignment((), "", "", 0, "", store_id) and store_id


def test_a_sharded_replica_refuses_another_replicas_client_and_names_it(tmp_path):
    theirs = next(f"token:c{i}" for i in itertools.count() if assign_shard(f"token:c{i}", (A, B)) == B)
    ours = next(f"token:c{i}" for i in itertools.count() if assign_shard(f"token:c{i}", (A, B)) == A)

    async def main():
        async with handler_state(tmp_path / "s", shards=f"{A},{B}", shard_name=A, auth="token") as state:
            shards.check_shard(state, ours, 2, shards_digest((B, A)))  # the same list in another order
            with pytest.raises(WrongShard) as wrong:
                shards.check_shard(state, theirs, 2)
            with pytest.raises(ShardListMismatch) as mismatch:
                shards.check_shard(state, ours, 3, shards_digest((A,)))
            return wrong.value, mismatch.value, shards.assignment(state, theirs), await state.counters()

    wrong, mismatch, assignment, counters = asyncio.run(main())
    assert wrong.shard == B and "nothing was stored here" in str(wrong)
    assert mismatch.own == shards_digest((A, B))
    assert assignment.assigned_shard == B and assignment.shard_name == A and set(assignment.shards) == {A, B}
    assert counters[f"reject:{RejectReason.WRONG_SHARD}"] == 2
    assert counters[f"reject:{RejectReason.SHARD_LIST_MISMATCH}"] == 3
