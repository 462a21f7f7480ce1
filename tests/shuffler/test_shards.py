"""Sharded shuffler replicas: the rendezvous assignment, the shard topology in the configuration,
the published shard list (GetShards), refusals of another replica's clients (with the address to
follow, nothing stored), SDK routing, and (slow) two real replica processes in front of one curator
showing exactly-once delivery and the per-client quota across replicas."""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import time
from collections import Counter
from typing import Any

import grpc
import pytest
from lac_testkit import BlockingAio, sdk_addresses_in_order
from shuffler_testkit import ServeProc, free_port, report, wait_for

import lac.client
from lac.client import AckStatus
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_clients
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.shards import (
    SHARD_METADATA_KEY,
    SHARDS_DIGEST_METADATA_KEY,
    assign_shard,
    parse_shards,
    shard_weight,
    shards_digest,
)

EXAMPLE = ("shuffler-a.example:50051", "shuffler-b.example:50051", "shuffler-c.example:50051")


# ---------------------------------------------------------------------------------------- the assignment


def test_assignment_is_the_rendezvous_formula_and_ignores_list_order():
    import hashlib

    golden = {"token:alice": EXAMPLE[2], "token:bob": EXAMPLE[1], "mtls:carol": EXAMPLE[0], "token:dave": EXAMPLE[0]}
    for client, shard in golden.items():
        for order in itertools.permutations(EXAMPLE):
            assert assign_shard(client, order) == shard
        weights = {s: hashlib.sha256(f"{s}\0{client}".encode()).digest() for s in EXAMPLE}
        assert max(weights, key=weights.get) == shard and weights[shard] == shard_weight(shard, client)
    assert assign_shard("token:alice", ["only:1"]) == "only:1"
    with pytest.raises(ValueError):
        assign_shard("token:alice", [])


def test_assignment_is_balanced_by_a_chi_square_test():
    """10,000 client ids over 3 shards. Under a uniform assignment the statistic is χ² with 2 degrees of
    freedom, whose tail is exp(-x/2): the bound 2·ln(10⁶) = 27.6 raises a false alarm with probability 10⁻⁶."""
    n = 10_000
    counts = Counter(assign_shard(f"token:client-{i}", EXAMPLE) for i in range(n))
    expected = n / len(EXAMPLE)
    chi2 = sum((counts[s] - expected) ** 2 / expected for s in EXAMPLE)
    assert chi2 < 2 * math.log(1e6), (counts, chi2)


def test_adding_or_removing_a_shard_moves_only_its_clients():
    ids = [f"token:client-{i}" for i in range(10_000)]
    before = {c: assign_shard(c, EXAMPLE) for c in ids}
    new = "shuffler-d.example:50051"
    after = {c: assign_shard(c, (*EXAMPLE, new)) for c in ids}
    moved = [c for c in ids if after[c] != before[c]]
    assert all(after[c] == new for c in moved)  # every moved client moved to the new shard
    # About a quarter moves (binomial, n = 10⁴, p = 1/4: sd 43; ±6 sd).
    assert abs(len(moved) - 2500) < 6 * 43, len(moved)
    removed = EXAMPLE[1]
    fewer = {c: assign_shard(c, (EXAMPLE[0], EXAMPLE[2])) for c in ids}
    assert {c for c in ids if fewer[c] != before[c]} == {c for c in ids if before[c] == removed}


def test_shard_lists_are_parsed_strictly():
    assert parse_shards("") == () and parse_shards(" , ") == ()
    assert parse_shards(" a:1, shuffler-b.example:50051 ,[::1]:7") == ("a:1", "shuffler-b.example:50051", "[::1]:7")
    for bad, why in (
        ("a", "not a replica address"),
        ("a:0", "port 1-65535"),
        ("a:70000", "port 1-65535"),
        ("a b:1", "not a replica address"),
        ("a:1,a:1", "listed more than once"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_shards(bad)


# ---------------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(shards="a:1,b:2"), "shard_name is required with shards"),
        (dict(shards="a:1,b:2", shard_name="c:3"), "shard_name must be this replica's entry in shards"),
        (dict(shard_name="a:1"), "but shards is empty"),
        (dict(shards="a:1,b:2", shard_name="a:1", auth="none"), "shards need client authentication"),
        (dict(shards="a:1,b", shard_name="a:1"), "'b' is not a replica address"),
        (dict(shards="a:1,b:2", shard_name="a:1", shards_effective_window=-1), "shards_effective_window"),
    ],
)
def test_config_refuses_a_bad_shard_topology(settings, message):
    with pytest.raises(ValueError, match=message):
        ShufflerConfig(**settings)
    assert ShufflerConfig(shards="a:1, b:2", shard_name="b:2").shard_list == ("a:1", "b:2")
    assert ShufflerConfig().shard_list == ()


def test_serve_refuses_a_bad_topology_in_one_line(tmp_path, capsys):
    import argparse

    from lac.common.cli import run_command
    from lac.shuffler.cli import register

    parser = argparse.ArgumentParser(prog="lac")  # `lac` with only its shuffler commands, as they are registered
    parser.add_argument("-v", "--verbose", action="store_true")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["shuffler", "serve", "--state-dir", str(tmp_path), "--shards", "a:1,b:2", "--shard-name", "c:3"]
    )
    assert run_command(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip()]
    assert "shard_name must be this replica's entry in shards (a:1, b:2); got 'c:3'" in err
    with pytest.raises(SystemExit):
        parser.parse_args(["shuffler", "serve", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--shards", "--shard-name", "--shards-effective-window"):
        assert flag in help_text


# ---------------------------------------------------------------------------------------- servers


@pytest.fixture
def two_replicas(start_replica, tmp_path):
    """Replicas A and B (in-process, token authentication, one tokens file) sharded over their addresses,
    and 12 registered clients: (replica addresses, {client id: token})."""
    ports = [free_port(), free_port()]
    shards = [f"127.0.0.1:{p}" for p in ports]
    ids = [f"c{i}" for i in range(12)]
    tokens = dict(zip(ids, add_clients(tmp_path / "replicas.tokens", ids)))
    for port, name in zip(ports, shards):
        start_replica(port, "127.0.0.1:1", shards=",".join(shards), shard_name=name, min_batch=1000)
    return shards, tokens


def _bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


def _status(address: str) -> shuffler_pb2.ShufflerStatus:
    with grpc.insecure_channel(address) as ch:  # plaintext test servers: every caller is also an operator
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)


def _sdk(address: str | list[str], aio: bool = False) -> Any:
    """The SDK's blocking client of ``address``, or (``aio``) its asyncio client behind the same methods."""
    if aio:
        return BlockingAio(address, insecure=True, timeout=10, attempts=1)
    return lac.client.ShufflerClient(address, insecure=True, timeout=10, attempts=1)


both_clients = pytest.mark.parametrize("aio", [False, True], ids=["blocking", "asyncio"])


def test_get_shards_publishes_the_list_and_each_callers_replica(two_replicas, start_shuffler):
    shards, tokens = two_replicas
    assigned = Counter()
    for name in shards:
        with grpc.insecure_channel(name) as ch:
            stub = shuffler_pb2_grpc.ShufflerStub(ch)
            for client, token in tokens.items():
                reply = stub.GetShards(shuffler_pb2.GetShardsRequest(), metadata=_bearer(token), timeout=10)
                assert list(reply.shards) == shards and reply.shard_name == name and reply.effective_window == 0
                assert reply.assigned_shard == assign_shard(f"token:{client}", shards)  # the identity, prefixed
                assigned[reply.assigned_shard] += 1
            with pytest.raises(grpc.RpcError) as err:  # anonymous: the role check comes first
                stub.GetShards(shuffler_pb2.GetShardsRequest(), metadata=_bearer("x" * 43), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert set(assigned) == set(shards)  # 12 clients: both replicas serve some (p = 1 - 2^-11)
    unsharded = start_shuffler("127.0.0.1:1", min_batch=1000)
    with grpc.insecure_channel(unsharded.address) as ch:
        reply = shuffler_pb2_grpc.ShufflerStub(ch).GetShards(shuffler_pb2.GetShardsRequest(), timeout=10)
    assert reply == shuffler_pb2.ShardAssignment(store_id=unsharded.shuffler.store_id)  # no shards, its log's id
    assert len(bytes.fromhex(reply.store_id)) == 16


def test_another_replicas_client_is_refused_with_its_address_and_nothing_is_stored(two_replicas):
    shards, tokens = two_replicas
    client = next(c for c in tokens if assign_shard(f"token:{c}", shards) == shards[1])
    with grpc.insecure_channel(shards[0]) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        calls = {
            "Submit": lambda: stub.Submit(
                shuffler_pb2.SubmitRequest(reports=[report(), report()]), metadata=_bearer(tokens[client]), timeout=10
            ),
            "SubmitStream": lambda: stub.SubmitStream(
                iter([shuffler_pb2.SubmitRequest(reports=[report()])] * 3), metadata=_bearer(tokens[client]), timeout=10
            ),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            assert (SHARD_METADATA_KEY, shards[1]) in err.value.trailing_metadata(), name
            details = err.value.details()
            assert "\n" not in details and f"belongs to the shuffler replica at {shards[1]}" in details
            assert "nothing was stored" in details
    status = _status(shards[0])
    assert status.buffered_reports == 0 and status.counters.get("accepted", 0) == 0
    assert status.rejects["wrong_shard"] == 3  # the reports of the Submit (2) and of the stream's first message
    # The same request at the right replica is stored.
    with grpc.insecure_channel(shards[1]) as ch:
        acks = (
            shuffler_pb2_grpc.ShufflerStub(ch)
            .Submit(shuffler_pb2.SubmitRequest(reports=[report()]), metadata=_bearer(tokens[client]), timeout=10)
            .acks
        )
    assert [a.status for a in acks] == [shuffler_pb2.ACK_STATUS_STORED]


def test_a_shard_list_for_a_later_window_is_not_applied_before_it(start_replica, tmp_path):
    port = free_port()
    token = add_clients(tmp_path / "replicas.tokens", ["alice"])[0]
    later = int(time.time() // 86400) + 1
    name = f"127.0.0.1:{port}"
    start_replica(port, "127.0.0.1:1", shards=f"{name},127.0.0.1:1", shard_name=name, shards_effective_window=later)
    with grpc.insecure_channel(name) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        assert (
            stub.GetShards(shuffler_pb2.GetShardsRequest(), metadata=_bearer(token), timeout=10).effective_window
            == later
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.Submit(shuffler_pb2.SubmitRequest(reports=[report()]), metadata=_bearer(token), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"applies from accounting window {later}" in err.value.details()
    wait = dict(err.value.trailing_metadata())["retry-after-seconds"]
    assert 1 <= int(wait) <= 86400
    assert _status(name).rejects["shards_not_effective"] == 1


# ---------------------------------------------------------------------------------------- the SDK


@both_clients
def test_sdk_routes_each_token_to_its_replica(two_replicas, aio):
    shards, tokens = two_replicas
    with _sdk(shards[0], aio) as c:  # the bootstrap address: replica A
        for client, token in tokens.items():
            acks = c.submit_prepared([report()], token=token)
            assert [a.status for a in acks] == [AckStatus.STORED]
            assert c.replica(token) == assign_shard(f"token:{client}", shards)
    expected = Counter(assign_shard(f"token:{c}", shards) for c in tokens)
    for name in shards:
        status = _status(name)
        assert status.counters["accepted"] == expected[name] and not status.rejects.get("wrong_shard")


@both_clients
def test_sdk_asks_the_next_bootstrap_address_when_one_is_down(two_replicas, monkeypatch, aio):
    """Several bootstrap addresses, the first one closed: the SDK asks the next for each token's replica and submits
    there (a bootstrap that is down costs a retry, as for unsharded replicas)."""
    sdk_addresses_in_order(monkeypatch)
    shards, tokens = two_replicas
    with _sdk([f"127.0.0.1:{free_port()}", shards[0]], aio) as c:
        for client, token in tokens.items():
            assert [a.status for a in c.submit_prepared([report()], token=token)] == [AckStatus.STORED]
            assert c.replica(token) == assign_shard(f"token:{client}", shards)
    assert sum(_status(name).counters["accepted"] for name in shards) == len(tokens)


@both_clients
def test_a_clients_own_replica_down_is_an_error_never_another_replica(start_replica, tmp_path, monkeypatch, aio):
    """Sharded replicas A and B, A stopped: a client of A bootstrapping from B (first, then A) gets a
    ``RetryableError`` naming A; B, which takes none of A's clients, stores nothing (its quota is not A's)."""
    sdk_addresses_in_order(monkeypatch)
    pa, pb = free_port(), free_port()
    a, b = f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"
    client = next(f"c{i}" for i in itertools.count() if assign_shard(f"token:c{i}", (a, b)) == a)
    token = add_clients(tmp_path / "replicas.tokens", [client])[0]
    replica_a = start_replica(pa, "127.0.0.1:1", shards=f"{a},{b}", shard_name=a, min_batch=1000)
    start_replica(pb, "127.0.0.1:1", shards=f"{a},{b}", shard_name=b, min_batch=1000)
    replica_a.stop()
    with _sdk([b, a], aio) as sdk, pytest.raises(lac.client.RetryableError) as err:
        sdk.submit_prepared([report()], token=token)
    assert f"could not connect to the shuffler at {a}: " in str(err.value), err.value
    status = _status(b)
    assert not status.counters.get("accepted") and not status.rejects


@both_clients
def test_sdk_refuses_replicas_midway_through_a_reshard(start_replica, tmp_path, caplog, aio):
    """A rolling reshard from [A, B] to [A, B, C] applied at once: A restarted with the new list, B not yet.
    A client that moves from A to C, bootstrapping from B (old list: A), would have been refused by A naming C
    and followed there, holding a fresh quota on C in this window; the lists differ, so the SDK now sends
    nothing (issue 23, item 19) — the list may change only at a window boundary, on every replica."""
    pa, pb, pc = free_port(), free_port(), free_port()
    a, b, c = (f"127.0.0.1:{p}" for p in (pa, pb, pc))
    old, new = f"{a},{b}", f"{a},{b},{c}"
    mover = next(
        f"m{i}"
        for i in itertools.count()
        if assign_shard(f"token:m{i}", (a, b)) == a and assign_shard(f"token:m{i}", (a, b, c)) == c
    )
    token = add_clients(tmp_path / "replicas.tokens", [mover])[0]
    replica_a = start_replica(pa, "127.0.0.1:1", shards=old, shard_name=a, min_batch=1000)
    start_replica(pb, "127.0.0.1:1", shards=old, shard_name=b, min_batch=1000)
    with _sdk(b, aio) as sdk:
        assert [x.status for x in sdk.submit_prepared([report()], token=token)] == [AckStatus.STORED]
        assert sdk.replica(token) == a
    replica_a.stop()
    with caplog.at_level(logging.WARNING, logger="lac.shuffler.shards"):
        start_replica(pa, "127.0.0.1:1", shards=new, shard_name=a, min_batch=1000)
    assert any("SHARD LIST CHANGED" in r.getMessage() for r in caplog.records)
    start_replica(pc, "127.0.0.1:1", shards=new, shard_name=c, min_batch=1000)
    with _sdk(b, aio) as sdk, pytest.raises(lac.client.NotRetryableError, match="shard lists differ"):
        sdk.submit_prepared([report()], token=token)
    assert not _status(a).rejects.get("wrong_shard") and not _status(c).counters.get("accepted")


@both_clients
def test_sdk_gives_up_when_replicas_disagree(start_replica, tmp_path, aio):
    """Misconfigured replicas whose lists name A differently ("127.0.0.1:PA" and "localhost:PA") would send a
    client back and forth: their shard-list digests differ, so the SDK raises NotRetryableError saying so."""
    pa, pb = free_port(), free_port()
    a, b, a_alias = f"127.0.0.1:{pa}", f"127.0.0.1:{pb}", f"localhost:{pa}"
    client = next(
        f"x{i}"
        for i in itertools.count()
        if assign_shard(f"token:x{i}", (a, b)) == b and assign_shard(f"token:x{i}", (a_alias, b)) == a_alias
    )
    token = add_clients(tmp_path / "replicas.tokens", [client])[0]
    start_replica(pa, "127.0.0.1:1", shards=f"{a},{b}", shard_name=a, min_batch=1000)
    start_replica(pb, "127.0.0.1:1", shards=f"{a_alias},{b}", shard_name=b, min_batch=1000)
    with _sdk(a, aio) as sdk, pytest.raises(lac.client.NotRetryableError) as err:
        sdk.submit_prepared([report()], token=token)
    assert isinstance(err.value, grpc.RpcError) and err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = str(err.value)
    assert "shard lists differ" in message and a in message and b in message and "\n" not in message
    assert not _status(a).counters.get("accepted") and not _status(b).counters.get("accepted")


@both_clients
def test_replicas_with_different_lists_do_not_store_a_client_twice(start_replica, tmp_path, aio):
    """Issue 23, item 19: replica A lists [A, B] and B lists [A', B] (A named differently), so each takes a
    client as its own; a quota-1 client bootstrapping once at A and once at B stored 2 reports in one window.
    Each replica publishes its list's digest: the SDK compares the replicas' and sends nothing, and a replica
    refuses a Submit routed by another list (its own digest in the trailer), storing nothing."""
    pa, pb = free_port(), free_port()
    a, b, a_alias = f"127.0.0.1:{pa}", f"127.0.0.1:{pb}", f"localhost:{pa}"
    client = next(
        f"y{i}"
        for i in itertools.count()
        if assign_shard(f"token:y{i}", (a, b)) == a and assign_shard(f"token:y{i}", (a_alias, b)) == b
    )
    token = add_clients(tmp_path / "replicas.tokens", [client])[0]
    start_replica(pa, "127.0.0.1:1", shards=f"{a},{b}", shard_name=a, min_batch=1000)
    start_replica(pb, "127.0.0.1:1", shards=f"{a_alias},{b}", shard_name=b, min_batch=1000)
    digests = {}
    for name in (a, b):
        with grpc.insecure_channel(name) as ch:
            reply = shuffler_pb2_grpc.ShufflerStub(ch).GetShards(
                shuffler_pb2.GetShardsRequest(), metadata=_bearer(token), timeout=10
            )
        assert reply.assigned_shard == reply.shard_name == name  # each takes this client as its own
        digests[name] = reply.shards_digest
    assert digests[a] == shards_digest([b, a]) and digests[b] == shards_digest([a_alias, b]) != digests[a]
    for bootstrap in (a, b):
        with _sdk(bootstrap, aio) as sdk, pytest.raises(lac.client.NotRetryableError) as err:
            sdk.submit_prepared([report()], token=token)
        assert "shard lists differ" in str(err.value) and "nothing was sent" in str(err.value)
    with grpc.insecure_channel(b) as ch, pytest.raises(grpc.RpcError) as refused:
        shuffler_pb2_grpc.ShufflerStub(ch).Submit(
            shuffler_pb2.SubmitRequest(reports=[report()]),
            metadata=(*_bearer(token), (SHARDS_DIGEST_METADATA_KEY, digests[a])),
            timeout=10,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (SHARDS_DIGEST_METADATA_KEY, digests[b]) in refused.value.trailing_metadata()
    assert "--shards differ" in refused.value.details() and "nothing was stored" in refused.value.details()
    assert _status(b).rejects["shard_list_mismatch"] == 1
    assert not _status(a).counters.get("accepted") and not _status(b).counters.get("accepted")


# ---------------------------------------------------------------------------------------- two real replicas

WINDOW_SECONDS = 1e9  # one accounting window for the whole test (no boundary can fall inside it)


@pytest.mark.slow
def test_two_replicas_exactly_once_and_quota_across_replicas(start_curator, curator_public_key, tmp_path):
    """Two ``lac shuffler serve`` processes (own state directories, the same tokens file contents,
    ``--shards A,B``) in front of one curator. 60 clients submit one report each through the SDK (a third
    of them retry the same idempotency ids), then every client tries a second report at its replica
    (quota) and at the other one with a raw stub (wrong shard). Every acknowledged report reaches the
    curator exactly once, no replica stores a report of another's client, and the quota of one report
    per window holds across replicas."""
    from lac_testkit import content

    from lac.common import envelope
    from lac.common.v1 import curator_pb2, curator_pb2_grpc

    curator = start_curator(window_seconds=WINDOW_SECONDS)
    ports = [free_port(), free_port()]
    shards = [f"127.0.0.1:{p}" for p in ports]
    ids = [f"client-{i:02d}" for i in range(60)]
    tokens_text = None
    replicas = []
    try:
        for port, name in zip(ports, shards):
            state = tmp_path / f"state-{port}"
            if tokens_text is None:
                tokens = dict(zip(ids, add_clients(state / "clients.tokens", ids)))
                tokens_text = (state / "clients.tokens").read_text()
            else:  # the same contents, in the replica's own state directory
                state.mkdir(mode=0o700)
                (state / "clients.tokens").write_text(tokens_text)
                (state / "clients.tokens").chmod(0o600)
            replicas.append(
                ServeProc(
                    [
                        "--port",
                        str(port),
                        "--state-dir",
                        str(state),
                        "--curator",
                        curator.address,
                        "--insecure",
                        "--min-batch",
                        "1",
                        "--window-seconds",
                        str(WINDOW_SECONDS),
                        "--metrics-port",
                        "0",
                        "--shards",
                        ",".join(shards),
                        "--shard-name",
                        name,
                    ],
                    tmp_path / f"proc-{port}",
                )
            )
        home = {c: assign_shard(f"token:{c}", shards) for c in ids}

        def sealed(report_id: bytes) -> shuffler_pb2.ClientReport:
            return shuffler_pb2.ClientReport(
                idempotency_id=os.urandom(16),
                payload=envelope.seal(content(["the", "dog", "sleeps"], report_id=report_id), curator_public_key),
            )

        sent: dict[str, bytes] = {}  # client -> report id of its acknowledged report
        with lac.client.ShufflerClient(
            shards[0], curator_key=curator_public_key, insecure=True, timeout=20, attempts=3
        ) as sdk:
            for i, c in enumerate(ids):
                sent[c] = os.urandom(16)
                first = sealed(sent[c])
                acks = sdk.submit_prepared([first], token=tokens[c])
                assert [a.status for a in acks] == [AckStatus.STORED], c
                if i % 3 == 0:  # a retry of the same request: acknowledged as a duplicate, stored once
                    again = sdk.submit_prepared([first], token=tokens[c])
                    assert [a.status for a in again] == [AckStatus.DUPLICATE], c
                assert sdk.replica(tokens[c]) == home[c]
            for c in ids:  # a second report in the window: refused by the client's replica (quota) ...
                with pytest.raises(lac.client.QuotaExceeded):
                    sdk.submit_prepared([sealed(os.urandom(16))], token=tokens[c])
        for c in ids:  # ... and by the other replica, whatever the client does (wrong shard)
            other = next(s for s in shards if s != home[c])
            with grpc.insecure_channel(other) as ch, pytest.raises(grpc.RpcError) as err:
                shuffler_pb2_grpc.ShufflerStub(ch).Submit(
                    shuffler_pb2.SubmitRequest(reports=[sealed(os.urandom(16))]),
                    metadata=_bearer(tokens[c]),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (SHARD_METADATA_KEY, home[c]) in err.value.trailing_metadata()

        per_replica = Counter(home.values())
        for proc, name in zip(replicas, shards):
            status = _status(name)
            assert status.counters["accepted"] == per_replica[name]  # only its own clients' reports
            assert status.counters["duplicates"] == sum(1 for i, c in enumerate(ids) if i % 3 == 0 and home[c] == name)
            assert status.rejects["wrong_shard"] == len(ids) - per_replica[name]
            assert status.rejects["quota"] == per_replica[name]
            assert (
                f'lac_shuffler_rejects_total{{reason="wrong_shard"}} {len(ids) - per_replica[name]}' in proc.metrics()
            )

        def delivered() -> bool:
            return sum(_status(s).reports_forwarded for s in shards) == len(ids) and not any(
                _status(s).batches_pending for s in shards
            )

        wait_for(delivered, timeout=30)
        batch_ids = [b for proc in replicas for b in re.findall(r"curator acknowledged batch (\w+)", proc.log_text())]
        assert len(batch_ids) == len(set(batch_ids)) >= 2  # no two replicas (or batches) share a batch id
        with grpc.insecure_channel(curator.address) as ch:
            cur = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)
        assert cur.reports == len(ids) and not cur.rejects  # exactly once: nothing replayed, nothing quarantined
        import sqlite3

        with sqlite3.connect(f"file:{tmp_path / 'curator0' / 'curator.sqlite'}?mode=ro", uri=True) as db:
            stored = [row[0] for row in db.execute("SELECT report_id FROM report_ids")]
        assert sorted(stored) == sorted(sent.values())
    finally:
        for proc in replicas:
            assert proc.stop() == 0
