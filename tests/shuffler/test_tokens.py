"""Client tokens on a real shuffler: bulk registration, expiry and rotation with a grace period, and
tokens files written before expiry existed (read as before, extended by appending)."""

from __future__ import annotations

import json
import os
import stat
import time

import grpc
import pytest
from lac_testkit import run_lac
from shuffler_testkit import report

from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_client, format_time, read_tokens, rotate_client, token_hash


def _submit(address, token):
    """One report submitted with ``token``: its ack status, or the refusal's (code, details)."""
    with grpc.insecure_channel(address) as ch:
        try:
            reply = shuffler_pb2_grpc.ShufflerStub(ch).Submit(
                shuffler_pb2.SubmitRequest(reports=[report()]),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=10,
            )
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return reply.acks[0].status


STORED = shuffler_pb2.ACK_STATUS_STORED


@pytest.fixture
def state(tmp_path):
    return tmp_path / "shuffler"


def _shuffler(start_shuffler, sink, state, **overrides):
    from lac.common.deployment import Deployment

    overrides.setdefault("reports_per_window", 100)
    sink.deployment = Deployment(reports_per_window=overrides["reports_per_window"])  # the curator's unit: the same
    return start_shuffler(sink.address, auth="token", state_dir=state, min_batch=100_000, **overrides)


def test_bulk_registration_of_10k_clients(start_shuffler, sink, state, capsys):
    """10,000 clients in one command (its time: benchmarks/bench_tokens.py)."""
    out = state.parent / "tokens.jsonl"
    code, _, err = run_lac(
        capsys, "shuffler", "add-clients", "--count", "10000", "--state-dir", str(state), "--out", str(out)
    )
    assert code == 0 and "10000 client(s) added" in err, err
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"client-{i}" for i in range(1, 10_001)]
    assert {r["role"] for r in rows} == {"client"} and {r["expires"] for r in rows} == {None}
    assert len({r["token"] for r in rows}) == 10_000
    stored = (state / "clients.tokens").read_text()
    assert not [r for r in rows[:50] if r["token"] in stored]  # only hashes are stored

    # The next bulk numbers on; ids already registered (or repeated) are refused whole, nothing appended.
    code, printed, _ = run_lac(capsys, "shuffler", "add-clients", "--count", "2", "--state-dir", str(state))
    assert code == 0 and [json.loads(line)["id"] for line in printed.splitlines()] == ["client-10001", "client-10002"]
    ids = state.parent / "ids.txt"
    ids.write_text("device-a\nclient-7\n")
    before = (state / "clients.tokens").read_bytes()
    code, _, err = run_lac(capsys, "shuffler", "add-clients", "--from-file", str(ids), "--state-dir", str(state))
    assert code == 2 and err.count("\n") == 1 and "already registered" in err and "rotate-client" in err, err
    assert (state / "clients.tokens").read_bytes() == before
    code, _, err = run_lac(
        capsys, "shuffler", "add-clients", "--count", "1", "--state-dir", str(state), "--out", str(out)
    )
    assert code == 2 and "exists" in err, err

    shf = _shuffler(start_shuffler, sink, state)
    for r in (rows[0], rows[4_999], rows[-1]):
        assert _submit(shf.address, r["token"]) == STORED


def test_an_expired_token_is_refused_as_expired_not_unknown(start_shuffler, sink, state, capsys):
    gone = add_client(state / "clients.tokens", "gone", expires=time.time() - 1)
    soon = add_client(state / "clients.tokens", "soon", expires=time.time() + 2)
    code, printed, _ = run_lac(
        capsys, "shuffler", "add-client", "later", "--expires-in", "90d", "--state-dir", str(state)
    )
    assert code == 0 and "expires 20" in printed
    later = printed.splitlines()[-1]
    shf = _shuffler(start_shuffler, sink, state)

    code, details = _submit(shf.address, gone)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "expired at" in details and "unknown" not in details
    assert "gone" not in details  # the message (which is logged) never names the client
    code, details = _submit(shf.address, "x" * 43)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "unknown" in details
    assert _submit(shf.address, soon) == STORED  # until its expiry, while the shuffler runs
    assert _submit(shf.address, later) == STORED
    time.sleep(max(0.0, read_tokens(state / "clients.tokens")[token_hash(soon)].expires - time.time()) + 0.1)
    assert _submit(shf.address, soon)[0] == grpc.StatusCode.UNAUTHENTICATED
    entry = read_tokens(state / "clients.tokens")[token_hash(later)]
    assert entry.expires is not None and 89 * 86400 < entry.expires - time.time() <= 90 * 86400


def test_rotation_keeps_the_old_token_for_the_grace_period(start_shuffler, sink, state, capsys):
    old = add_client(state / "clients.tokens", "alice")
    ops = add_client(state / "clients.tokens", "alice", role="operator")
    shf = _shuffler(start_shuffler, sink, state)

    code, _, err = run_lac(capsys, "shuffler", "rotate-client", "alice", "--state-dir", str(state))
    assert code == 2 and "--role" in err and err.count("\n") == 1, err  # a client and an operator token
    code, printed, _ = run_lac(
        capsys, "shuffler", "rotate-client", "alice", "--role", "client", "--grace", "3s", "--state-dir", str(state)
    )
    assert code == 0 and "1 previous token(s) work until" in printed, printed
    new = printed.splitlines()[-1]
    assert _submit(shf.address, new) == STORED and _submit(shf.address, old) == STORED  # within the grace
    tokens = read_tokens(state / "clients.tokens")
    assert tokens[token_hash(new)].expires is None and tokens[token_hash(ops)].expires is None
    time.sleep(max(0.0, tokens[token_hash(old)].expires - time.time()) + 0.1)
    code, details = _submit(shf.address, old)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "expired" in details
    assert _submit(shf.address, new) == STORED
    with grpc.insecure_channel(shf.address) as ch:  # one client throughout: one quota, whichever token
        status = shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(
            shuffler_pb2.ShufflerStatusRequest(), metadata=(("authorization", f"Bearer {ops}"),), timeout=10
        )
    assert status.buffered_reports == 3 and status.buffered_clients == 1

    # --grace 0 ends the old token at once; an unknown client is one line, exit 2.
    newer = rotate_client(state / "clients.tokens", "alice", 0, role="client").token
    assert _submit(shf.address, new)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert _submit(shf.address, newer) == STORED
    code, _, err = run_lac(capsys, "shuffler", "rotate-client", "bob", "--state-dir", str(state))
    assert code == 2 and "no current token" in err and err.count("\n") == 1, err
    code, _, err = run_lac(capsys, "shuffler", "rotate-client", "alice", "--grace", "soon", "--state-dir", str(state))
    assert code == 2 and "argument --grace" in err, err


def test_a_tokens_file_from_before_expiry_reads_as_before_and_is_extended(start_shuffler, sink, state):
    """The old format (hash, id, optional role; comments) stays valid; new lines are appended after it."""
    state.mkdir(parents=True)
    client, operator = "c" * 43, "o" * 43
    (state / "clients.tokens").write_text(
        f"# written by an older version\n{token_hash(client)} alice\n{token_hash(operator)} ops operator  # on call"
    )  # no newline at the end: a hand-edited file
    tokens = read_tokens(state / "clients.tokens")
    assert [(t.client_id, t.role.value, t.expires) for t in tokens.values()] == [
        ("alice", "client", None),
        ("ops", "operator", None),
    ]
    bob = add_client(state / "clients.tokens", "bob", expires=time.time() + 3600)
    rotated = rotate_client(state / "clients.tokens", "alice", 3600)
    text = (state / "clients.tokens").read_text()
    assert text.startswith(f"# written by an older version\n{token_hash(client)} alice\n")
    assert f"ops operator  # on call\n{token_hash(bob)} bob client expires=" in text
    assert f"{token_hash(client)} alice client expires={format_time(rotated.old_until)}\n" in text
    shf = _shuffler(start_shuffler, sink, state)
    for token in (client, bob, rotated.token):
        assert _submit(shf.address, token) == STORED

    bad = state.parent / "bad.tokens"
    for line in (f"{token_hash(client)} alice client expires=tomorrow", f"{token_hash(client)} alice admin"):
        bad.write_text(line + "\n")
        with pytest.raises(ValueError, match="bad.tokens:1: expected"):
            read_tokens(bad)
