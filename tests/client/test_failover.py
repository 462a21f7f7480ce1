"""The SDK's failover between a shuffler's replicas (``ShufflerClient([a, b, ...])``, and its asyncio twin):
against real shufflers on loopback, a replica that is down, draining (SIGTERM to ``lac shuffler serve``) or
refusing with UNAVAILABLE costs a retry at the next address, not an error; refusals that another replica would
repeat (the quota, the token) are not asked elsewhere; when every address fails, one error names each address
and why. (Sharded replicas, where only a client's own replica may take its reports: tests/shuffler/test_shards.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from client_testkit import assert_wrapped, privatized, silent_port
from lac_testkit import (
    DEADLINE,
    PROMPT,
    BlockingAio,
    ServeProc,
    content,
    free_port,
    run_lac,
    sdk_addresses_in_order,
    wait_until,
)

import lac.client
from lac.client import AckStatus
from lac.common import envelope
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler import intake
from lac.shuffler.reportlog import KEY_FILE, write_key

STORED = AckStatus.STORED
both_clients = pytest.mark.parametrize("aio", [False, True], ids=["blocking", "asyncio"])


def _client(addresses, aio: bool, **kw):
    """The blocking client of ``addresses``, or (``aio``) the asyncio one behind the same methods."""
    kw = {"insecure": True, "timeout": DEADLINE, "attempts": 1, **kw}
    return BlockingAio(addresses, **kw) if aio else lac.client.ShufflerClient(addresses, **kw)


def _status(address: str) -> shuffler_pb2.ShufflerStatus:
    """A plaintext test shuffler's status (every caller of one is also an operator)."""
    with grpc.insecure_channel(address) as ch:
        return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=DEADLINE)


@pytest.fixture
def in_order(monkeypatch):
    """Clients made in the test try their addresses in the order given (``sdk_addresses_in_order``)."""
    sdk_addresses_in_order(monkeypatch)


@pytest.fixture
def full_shuffler(start_shuffler, sink):
    """A real shuffler whose report log is full (``max_log_bytes`` 1): it answers every Submit UNAVAILABLE
    with ``retry-after-seconds`` 30 (so every refusal the tests see is the shuffler's own)."""
    return lambda: start_shuffler(sink.address, min_batch=1000, max_log_bytes=1)


def test_addresses_are_checked():
    for bad in ([], [""], ["a:1", "a:1"]):
        with pytest.raises(ValueError, match="shuffler address"):
            lac.client.ShufflerClient(bad, insecure=True)
        with pytest.raises(ValueError, match="shuffler address"):
            lac.client.AsyncShufflerClient(bad, insecure=True)


@both_clients
def test_an_address_that_cannot_take_the_call_passes_it_to_the_next_at_once(
    start_shuffler, sink, full_shuffler, in_order, glove200, aio
):
    """Addresses tried in turn within one attempt (``attempts=1``: no second round, no back-off): a closed port,
    a host that does not answer, a shuffler answering UNAVAILABLE with retry-after 30 s, then a healthy one.
    Each submission is stored there once, without waiting out the 30 s; the next call starts at the address
    that answered, so the failed ones cost nothing more."""
    full, healthy = full_shuffler(), start_shuffler(sink.address, min_batch=1000)
    with silent_port() as silent:
        addresses = [f"127.0.0.1:{free_port()}", silent, full.address, healthy.address]
        with _client(addresses, aio, connect_timeout=0.5) as c:
            t0 = time.monotonic()
            acks = c.submit([privatized(glove200, "the king"), privatized(glove200, "the queen")])
            seconds = time.monotonic() - t0
            assert c.replica() == healthy.address
            more = [c.submit(privatized(glove200, f"a message {i}")) for i in range(3)]
    assert [a.status for a in acks] == [STORED, STORED] and all(a.status == STORED for (a,) in more)
    assert seconds < PROMPT, seconds  # did not sleep the 30 s retry-after (one healthy replica answered)
    assert healthy.shuffler.buffered() == 5 and full.shuffler.buffered() == 0
    assert _status(full.address).rejects["log_full"] == 2  # the first call's 2 reports, once


@both_clients
def test_a_replica_stopped_between_calls_costs_no_error(start_shuffler, sink, tmp_path, in_order, glove200, aio):
    """Two real replicas; the one the client uses is stopped (graceful, as a SIGTERM does), and the next calls
    go to the other; once it is back, and the other stopped, the client returns to it. Nothing stored twice."""
    port = free_port()
    a, b = start_shuffler(sink.address, port=port, min_batch=1000), start_shuffler(sink.address, min_batch=1000)
    with _client([a.address, b.address], aio) as c:
        assert c.submit(privatized(glove200))[0].status == STORED and c.replica() == a.address
        a.stop()
        assert c.submit(privatized(glove200))[0].status == STORED and c.replica() == b.address
        a = start_shuffler(sink.address, port=port, min_batch=1000, state_dir=tmp_path / "a-again")
        b.stop()
        assert c.submit(privatized(glove200))[0].status == STORED and c.replica() == a.address
    assert a.shuffler.buffered() == 1 and b.shuffler.buffered() == 1  # a's first report is in its first state


@both_clients
def test_answers_other_replicas_would_repeat_are_not_asked_elsewhere(
    start_shuffler, sink, tmp_path, in_order, glove200, aio
):
    """Two replicas that know the same clients (quota 1 per window): a second report is refused by the quota at
    the first replica and not sent to the second; a bad token is refused by the first only."""
    from lac.shuffler.auth import add_client

    tokens_file = tmp_path / "replicas.tokens"
    token = add_client(tokens_file, "alice")
    a, b = (
        start_shuffler(sink.address, auth="token", tokens_file=tokens_file, reports_per_window=1, min_batch=1000)
        for _ in range(2)
    )
    with _client([a.address, b.address], aio, token=token) as c:
        assert c.submit(privatized(glove200))[0].status == STORED
        with pytest.raises(lac.client.QuotaExceeded) as err:
            c.submit(privatized(glove200, "a second message"))
        assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.RESOURCE_EXHAUSTED)
        with pytest.raises(lac.client.AuthenticationError):
            c.submit(privatized(glove200), token="not-a-token")
    assert a.shuffler.buffered() == 1 and b.shuffler.buffered() == 0
    assert not _status(b.address).rejects, "the second replica was asked"


@both_clients
def test_every_address_failing_is_one_error_naming_each_and_why(full_shuffler, glove200, monkeypatch, aio):
    """A closed port, a silent host and a full shuffler, 2 attempts: one ``RetryableError`` (UNAVAILABLE) naming
    the three and gRPC's or the shuffler's reason for each, after a second round that did not wait the 30 s the
    full one asked for (the others asked for no wait). Closed ports only: at once, nothing was sent."""
    full = full_shuffler()
    with silent_port() as silent:
        closed = f"127.0.0.1:{free_port()}"
        with _client([closed, silent, full.address], aio, connect_timeout=0.5, attempts=2) as c:
            t0 = time.monotonic()
            with pytest.raises(lac.client.RetryableError) as err:
                c.submit(privatized(glove200))
            seconds = time.monotonic() - t0
    assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.UNAVAILABLE)
    message = str(err.value)
    assert message.startswith("Shuffler.Submit failed: UNAVAILABLE: none of the 3 shuffler addresses took the call: ")
    assert f"{closed}: not reached (" in message and "Connection refused" in message, message
    assert f"{silent}: not reached (no answer to the connection attempt" in message, message
    assert f"{full.address}: UNAVAILABLE: report log full" in message and "(retry after 30 s)" in message, message
    assert "nothing was sent" not in message and err.value.retry_after is None  # two asked for no wait
    assert 2 * 0.5 <= seconds < PROMPT, seconds  # two rounds, each waiting out the silent host's connect_timeout
    assert _status(full.address).rejects["log_full"] == 2  # asked once per round

    closed = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    with _client(closed, aio, connect_timeout=DEADLINE, attempts=5) as c:
        t0 = time.monotonic()
        with pytest.raises(lac.client.RetryableError) as err:
            c.submit(privatized(glove200))
    assert time.monotonic() - t0 < PROMPT  # no connect_timeout, no second round
    assert all(f"{a}: not reached (" in str(err.value) for a in closed) and str(err.value).endswith("nothing was sent")


@both_clients
def test_retry_after_is_honoured_when_every_replica_asked_for_it(full_shuffler, glove200, aio):
    """Two full replicas, each asking for 30 s: the error's ``retry_after`` is 30 (the smallest asked)."""
    a, b = full_shuffler(), full_shuffler()
    with _client([a.address, b.address], aio) as c, pytest.raises(lac.client.RetryableError) as err:
        c.submit(privatized(glove200))
    assert err.value.retry_after == 30 and f"{a.address}: UNAVAILABLE: report log full" in str(err.value)


@both_clients
def test_one_address_with_several_ip_addresses(start_shuffler, sink, glove200, aio):
    """One target resolving to two addresses (gRPC's ``ipv4:`` form, as a DNS name with two A records), one of
    them closed: gRPC connects to the other. Then the replica it connected to stops: the next call (a retry,
    when the stop was noticed only by it) connects to the other address, here a replica started in its place."""
    ports = [free_port(), free_port()]
    live = start_shuffler(sink.address, port=ports[1], min_batch=1000)
    target = f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    with _client(target, aio, attempts=3) as c:
        assert c.submit(privatized(glove200))[0].status == STORED
        other = start_shuffler(sink.address, port=ports[0], min_batch=1000)
        live.stop()
        assert c.submit(privatized(glove200))[0].status == STORED
    assert live.shuffler.buffered() == 1 and other.shuffler.buffered() == 1


@pytest.fixture
def cancelling_server():
    """A real gRPC server whose ``Shuffler.Submit`` answers CANCELLED, as a shuffler does for calls it had received
    but not started when it begins to shut down (counts its calls), and whose ``GetShards`` reports the report log
    id the test puts in ``store`` (a replica of that log)."""
    from concurrent import futures

    calls: list[int] = []
    store = [""]

    def cancel(raw, context):
        calls.append(1)
        context.abort(grpc.StatusCode.CANCELLED, "server shutting down")

    def shards(raw, context):
        return shuffler_pb2.ShardAssignment(store_id=store[0]).SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    methods = {
        "Submit": grpc.unary_unary_rpc_method_handler(cancel, request_deserializer=None, response_serializer=None),
        "GetShards": grpc.unary_unary_rpc_method_handler(shards, request_deserializer=None, response_serializer=None),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("lac.v1.Shuffler", methods)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", calls, store
    server.stop(0)


@both_clients
def test_a_call_the_server_cancelled_is_retried_at_a_replica_of_its_log(
    cancelling_server, start_shuffler, sink, in_order, glove200, aio
):
    """CANCELLED comes from the server (the SDK raises its own error for a call it gives up), and the call may have
    been stored: passed on to the next address when that reports the same report log (GetShards' store_id), else
    sent to the same address again; alone, a ``RetryableError`` after the client's attempts."""
    address, calls, store = cancelling_server
    healthy = start_shuffler(sink.address, min_batch=1000)
    store[0] = healthy.shuffler.store_id
    with _client([address, healthy.address], aio) as c:
        assert c.submit(privatized(glove200))[0].status == STORED
    assert calls == [1] and healthy.shuffler.buffered() == 1
    store[0] = "another report log"
    with _client([address, healthy.address], aio, attempts=2) as c, pytest.raises(lac.client.RetryableError) as err:
        c.submit(privatized(glove200))
    assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.CANCELLED)
    assert len(calls) == 3 and "server shutting down" in str(err.value)
    assert healthy.shuffler.buffered() == 1  # never sent to a replica of another log


@both_clients
def test_a_submit_that_may_have_stored_is_never_stored_in_a_second_log(
    start_shuffler, sink, in_order, glove200, aio, monkeypatch
):
    """Two independent shufflers (two SQLite report logs: two store ids) behind one client list; the first stores
    the report, then holds its reply past the call's deadline (DEADLINE_EXCEEDED: the client cannot know whether it
    was stored). The SDK sends it to the first again, not to the second: stored once, in the first log, acknowledged
    DUPLICATE. (Passed on to the second, as before this guard, it was stored in both.)"""
    first, second = (start_shuffler(sink.address, min_batch=1000) for _ in range(2))
    assert first.shuffler.store_id != second.shuffler.store_id
    held: list[int] = []
    release = threading.Event()
    submit = intake.submit

    async def stored_then_late(state, *args, **kwargs):
        result = await submit(state, *args, **kwargs)  # committed
        if state is first.shuffler and not held:
            held.append(1)
            await asyncio.to_thread(release.wait, 2 * DEADLINE)  # the reply, after the client's deadline
        return result

    monkeypatch.setattr(intake, "submit", stored_then_late)  # the first shuffler's Submit handler
    try:
        with _client([first.address, second.address], aio, timeout=3.0, attempts=5) as c:
            acks = c.submit(privatized(glove200))
    finally:
        release.set()
    assert held and [a.status for a in acks] == [AckStatus.DUPLICATE]
    assert first.shuffler.buffered() == 1 and second.shuffler.buffered() == 0


def test_the_cli_takes_several_servers(start_shuffler, sink, data_dir, glove50k, tmp_path, capsys, in_order):
    """``lac client submit --server A --server B``: a closed A costs nothing; both closed, one line naming both."""
    shf = start_shuffler(sink.address, min_batch=1000)
    wait_until(lambda: shf.shuffler.deployment is not None)
    messages = tmp_path / "messages.txt"
    messages.write_text("hello world\n", encoding="utf-8")
    closed = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    code, out, err = run_lac(
        capsys, "client", "submit", str(messages), "--insecure", "--server", closed[0], "--server", shf.address
    )
    assert code == 0 and out.startswith("stored 1 of 1 line"), (out, err)
    assert shf.shuffler.buffered() == 1
    code, out, err = run_lac(
        capsys, "client", "submit", str(messages), "--insecure", "--server", closed[0], "--server", closed[1]
    )
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err, err
    assert last.startswith(
        "lac client submit: error: RetryableError: Shuffler.GetDeployment failed: UNAVAILABLE: "
        "none of the 2 shuffler addresses took the call: "
    ), last
    assert all(f"{a}: not reached (" in last for a in closed) and last.endswith("nothing was sent"), last


# ---------------------------------------------------------------------------------------- SIGTERM, end to end

WINDOW_SECONDS = 1e9  # one accounting window for the whole test


def _serve(curator: str, state, port: int, workdir, store: str) -> ServeProc:
    """``lac shuffler serve`` on ``port`` with its own state directory and the report log in ``store``, releasing
    batches of one report or more after each commit and every second."""
    args = ["--port", str(port), "--state-dir", str(state), "--store", store, "--curator", curator, "--insecure"]
    args += ["--min-batch", "1", "--release-interval-seconds", "1", "--window-seconds", str(WINDOW_SECONDS)]
    return ServeProc(args, workdir)


@pytest.mark.slow
@both_clients
def test_sigterm_to_the_replica_in_use_mid_stream_costs_no_error_nothing_lost_or_doubled(
    start_curator, curator_public_key, tmp_path, postgres_url, aio
):
    """Three ``lac shuffler serve`` processes over one PostgreSQL report log (own state directories, one tokens
    file's contents) in front of one curator; 60 clients submit one sealed report each through one SDK client, 4
    at a time. After 20, the replica in use gets SIGTERM (it drains: calls in flight finish, new ones are refused):
    every submission still succeeds (a call it cancelled may have been stored, so it goes on only to replicas of
    the same log). The stopped replica is started again; the curator then holds each of the 60 reports exactly
    once (its replay check would have refused a second copy)."""
    from lac.shuffler.auth import add_clients

    curator = start_curator(window_seconds=WINDOW_SECONDS)
    ids = [f"client-{i:02d}" for i in range(60)]
    tokens = dict(zip(ids, add_clients(tmp_path / "clients.tokens", ids)))
    ports = [free_port() for _ in range(3)]
    states = [tmp_path / f"state-{p}" for p in ports]
    client_key = os.urandom(32)  # every replica's state directory holds the same key of the client hashes
    for state in states:
        state.mkdir(mode=0o700)
        write_key(state / KEY_FILE, client_key)
        (state / "clients.tokens").write_bytes((tmp_path / "clients.tokens").read_bytes())
        (state / "clients.tokens").chmod(0o600)
    procs: list[ServeProc] = []
    for s, p in zip(states, ports):
        try:
            procs.append(_serve(curator.address, s, p, tmp_path / f"proc-{p}", postgres_url))
        except BaseException:  # no replica left running when another cannot start
            for started in procs:
                started.stop()
            raise
    sent: dict[str, bytes] = {}  # client -> the report id of its acknowledged report
    addresses = [p.address for p in procs]
    try:

        def report(c: str) -> shuffler_pb2.ClientReport:
            rid = os.urandom(16)
            sealed = envelope.seal(content(["the", "dog", "sleeps"], report_id=rid), curator_public_key)
            return shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=sealed), rid

        options = dict(curator_key=curator_public_key, insecure=True, timeout=DEADLINE, attempts=3)
        if aio:
            done = threading.Event()

            def submit_all() -> None:
                async def main() -> None:
                    gate = asyncio.Semaphore(4)
                    async with lac.client.AsyncShufflerClient(addresses, **options) as sdk:

                        async def one(c: str) -> None:
                            async with gate:
                                r, rid = report(c)
                                acks = await sdk.submit_prepared([r], token=tokens[c])
                                assert [a.status for a in acks] in ([STORED], [AckStatus.DUPLICATE]), c
                                sent[c] = rid
                                if len(sent) == 20:
                                    in_use.append(await sdk.replica(tokens[c]))

                        await asyncio.gather(*(one(c) for c in ids))

                try:
                    asyncio.run(main())
                finally:
                    done.set()

            in_use: list[str] = []
            errors_seen: list[BaseException] = []

            def run() -> None:
                try:
                    submit_all()
                except BaseException as exc:
                    errors_seen.append(exc)

            worker = threading.Thread(target=run)
            worker.start()
            wait_until(lambda: in_use or done.is_set(), timeout=DEADLINE)
            victim = addresses.index(in_use[0]) if in_use else None
            if victim is not None:
                procs[victim].process.send_signal(signal.SIGTERM)
            worker.join(120)
            assert not errors_seen, errors_seen
        else:
            with lac.client.ShufflerClient(addresses, **options) as sdk, ThreadPoolExecutor(4) as pool:

                def one(c: str) -> None:
                    r, rid = report(c)
                    acks = sdk.submit_prepared([r], token=tokens[c])
                    assert [a.status for a in acks] in ([STORED], [AckStatus.DUPLICATE]), c
                    sent[c] = rid

                futures = [pool.submit(one, c) for c in ids]
                wait_until(lambda: len(sent) >= 20, timeout=DEADLINE)
                victim = addresses.index(sdk.replica())
                procs[victim].process.send_signal(signal.SIGTERM)
                for f in futures:
                    f.result()  # no submission failed
        assert victim is not None and len(sent) == len(ids)
        assert procs[victim].process.wait(DEADLINE) == 0  # drained and exited cleanly (stop() would signal again)
        procs[victim].stop()
        assert "shuffler stopping" in procs[victim].log_text()
        again = tmp_path / f"proc-{ports[victim]}-again"
        procs[victim] = _serve(curator.address, states[victim], ports[victim], again, postgres_url)

        def curator_status() -> curator_pb2.CuratorStatus:
            with grpc.insecure_channel(curator.address) as ch:
                return curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)

        wait_until(lambda: curator_status().reports >= len(ids), timeout=60)
        status = curator_status()
        assert status.reports == len(ids) and not status.rejects  # nothing replayed, nothing quarantined
        with sqlite3.connect(f"file:{tmp_path / 'curator0' / 'curator.sqlite'}?mode=ro", uri=True) as db:
            stored = [row[0] for row in db.execute("SELECT report_id FROM report_ids")]
        assert sorted(stored) == sorted(sent.values())
        assert _status(addresses[0]).counters["accepted"] == len(ids)  # the replicas' one log
    finally:
        for proc in procs:
            proc.stop()
