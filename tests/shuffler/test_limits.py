"""Stated limits, each enforced with the status it documents, and storage failures injected into
the release and commit paths of an in-process shuffler.

| limit | setting | status |
| --- | --- | --- |
| message size | ``max_message_bytes`` | RESOURCE_EXHAUSTED from gRPC (before parsing; no retry-after) |
| reports per call | ``max_reports_per_request`` (Submit; a SubmitStream call in total) | INVALID_ARGUMENT from us |
| calls per connection | ``max_concurrent_streams`` | the call waits (DEADLINE_EXCEEDED) or UNAVAILABLE |
| open connections | ``max_connections`` | a further connection is closed at once: UNAVAILABLE |
| commit queue | ``max_pending_bytes`` | UNAVAILABLE with retry-after-seconds |
| commit time | ``commit_timeout_seconds`` | UNAVAILABLE with retry-after-seconds; health NOT_SERVING |
| receiving a request | ``receive_timeout_seconds`` | UNAVAILABLE with retry-after-seconds |
| who may send a request | the caller is authenticated before its request is received | UNAUTHENTICATED |
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time

import grpc
import pytest
from lac_testkit import DEADLINE, PROMPT, health
from shuffler_testkit import payload, report, tag_of, wait_for

from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc


def _shuffler(shf):
    return shf.shuffler  # its ShufflerState


def _submit(address, reports, timeout=10):
    with grpc.insecure_channel(address) as ch:
        return (
            shuffler_pb2_grpc.ShufflerStub(ch).Submit(shuffler_pb2.SubmitRequest(reports=reports), timeout=timeout).acks
        )


def _error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value


def _retry_after(err: grpc.RpcError) -> int | None:
    value = dict(err.trailing_metadata() or ()).get("retry-after-seconds")
    return None if value is None else int(value)


def _big(size: int) -> shuffler_pb2.ClientReport:
    return shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload(os.urandom(16), size))


def test_oversized_message_is_resource_exhausted_from_grpc(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000, max_message_bytes=64 * 1024)
    err = _error(lambda: _submit(shf.address, [_big(40_000), _big(40_000)]))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and _retry_after(err) is None
    assert len(_submit(shf.address, [_big(40_000)])) == 1  # under the limit: served


def test_reports_per_call_is_invalid_argument_for_submit_and_for_a_whole_stream(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000, max_reports_per_request=4)
    err = _error(lambda: _submit(shf.address, [report() for _ in range(5)]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 4" in err.details()
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        two = [shuffler_pb2.SubmitRequest(reports=[report(), report()]) for _ in range(2)]
        assert len(stub.SubmitStream(iter(two), timeout=10).acks) == 4
        three = [shuffler_pb2.SubmitRequest(reports=[report(), report()]) for _ in range(3)]
        err = _error(lambda: stub.SubmitStream(iter(three), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "SubmitStream" in err.details()


def test_a_message_of_many_tiny_reports_is_refused_before_it_is_parsed(start_shuffler, sink, tmp_path):
    """2 bytes on the wire per empty report, ~70 bytes once parsed: counted on the raw bytes first."""
    from lac.shuffler.auth import add_client

    state = tmp_path / "tiny"
    token = add_client(state / "clients.tokens", "alice")
    shf = start_shuffler(sink.address, min_batch=1000, auth="token", state_dir=state)
    raw = b"\x0a\x00" * 3_500_000  # 7 MB (under max_message_bytes, 8 MiB): 3.5 million empty reports
    md = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(shf.address) as ch:
        submit = ch.unary_unary("/lac.v1.Shuffler/Submit", request_serializer=None, response_deserializer=None)
        stream = ch.stream_unary("/lac.v1.Shuffler/SubmitStream", request_serializer=None, response_deserializer=None)
        for call in (
            lambda: submit(raw, metadata=md, timeout=DEADLINE),
            lambda: stream(iter([raw]), metadata=md, timeout=DEADLINE),
        ):
            t0 = time.monotonic()
            err = _error(call)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than 10000 reports" in err.details()
            assert time.monotonic() - t0 < PROMPT
        assert _error(lambda: submit(raw, timeout=10)).code() == grpc.StatusCode.UNAUTHENTICATED  # no token


def test_concurrent_calls_per_connection_are_limited(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000, max_concurrent_streams=2)

    async def main():
        own = [("grpc.use_local_subchannel_pool", 1)]  # two channels, two connections (no shared subchannel)
        async with (
            grpc.aio.insecure_channel(shf.address, options=own) as busy,
            grpc.aio.insecure_channel(shf.address, options=own) as other,
        ):
            stub = shuffler_pb2_grpc.ShufflerStub(busy)
            await stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)  # connected, limit known
            streams = [stub.SubmitStream(timeout=30) for _ in range(2)]
            for s in streams:  # two calls open on this connection, neither finished
                await s.write(shuffler_pb2.SubmitRequest(reports=[report()]))
            await asyncio.sleep(0.3)
            try:
                await stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=1.5)
                third = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                third = exc.code()
            # another connection is served meanwhile
            await shuffler_pb2_grpc.ShufflerStub(other).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5)
            for s in streams:
                await s.done_writing()
                assert len((await s).acks) == 1
            await stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5)  # a stream is free again
            return third

    third = asyncio.run(main())
    assert third in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE), third


def test_connections_beyond_max_connections_are_closed_at_once(start_shuffler, sink):
    """Issue 23, item 6: connections were bounded only by the file-descriptor limit (at 1,100 new handshakes
    timed out); beyond max_connections a new one is closed as soon as it is accepted, and once one closes
    another is taken."""
    shf = start_shuffler(sink.address, min_batch=1000, max_connections=4)
    own = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.insecure_channel(shf.address, options=own) for _ in range(5)]
    try:
        for ch in channels[:4]:
            shuffler_pb2_grpc.ShufflerStub(ch).GetShards(shuffler_pb2.GetShardsRequest(), timeout=5)
        t0 = time.monotonic()
        err = _error(
            lambda: shuffler_pb2_grpc.ShufflerStub(channels[4]).GetShards(
                shuffler_pb2.GetShardsRequest(), timeout=DEADLINE
            )
        )
        assert err.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t0 < PROMPT, err
        channels[0].close()
        wait_for(lambda: _connects(shf.address, own))
    finally:
        for ch in channels:
            ch.close()


def _connects(address, options) -> bool:
    with grpc.insecure_channel(address, options=options) as ch:
        try:
            shuffler_pb2_grpc.ShufflerStub(ch).GetShards(shuffler_pb2.GetShardsRequest(), timeout=2)
        except grpc.RpcError:
            return False
    return True


def test_full_commit_queue_is_unavailable_with_retry_after(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000, max_pending_bytes=3000)
    log = _shuffler(shf).reportlog
    gate, entered = threading.Event(), threading.Event()
    original = log.append_groups

    def slow_append(*args):
        entered.set()
        gate.wait(2 * DEADLINE)
        return original(*args)

    log.append_groups = slow_append
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(acks=_submit(shf.address, [_big(2000)])))
    t.start()
    assert entered.wait(10)  # the first call's commit is in progress: its 2 KB count as pending
    t0 = time.monotonic()
    err = _error(lambda: _submit(shf.address, [_big(2000)], timeout=DEADLINE))
    assert time.monotonic() - t0 < PROMPT
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "ingest queue full" in err.details()
    assert _retry_after(err) == 1
    gate.set()
    t.join(10)
    assert len(first["acks"]) == 1
    log.append_groups = original
    assert len(_submit(shf.address, [_big(2000)])) == 1  # the queue drained: accepted again


def _storage_error(kind: str) -> Exception:
    if kind == "oserror":
        return OSError(errno.EIO, "Input/output error")
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode, exc.sqlite_errorname = sqlite3.SQLITE_IOERR_WRITE, "SQLITE_IOERR_WRITE"
    return exc


@pytest.mark.parametrize("kind", ["sqlite", "oserror"])
def test_write_error_in_the_release_path_is_reported_and_recovers(start_shuffler, sink, kind, caplog):
    shf = start_shuffler(sink.address, min_batch=3)
    shuffler = _shuffler(shf)
    log = shuffler.reportlog
    original, failing = log.release, threading.Event()
    failing.set()

    def release(*args):
        if failing.is_set():
            raise _storage_error(kind)
        return original(*args)

    log.release = release
    first = [report() for _ in range(3)]
    assert len(_submit(shf.address, first)) == 3  # stored and acknowledged; the release after it fails
    wait_for(lambda: health(shf.address) == health(shf.address, "lac.v1.Shuffler") == "NOT_SERVING")
    t0 = time.monotonic()
    err = _error(lambda: _submit(shf.address, [report()], timeout=DEADLINE))
    assert time.monotonic() - t0 < PROMPT and err.code() == grpc.StatusCode.UNAVAILABLE and _retry_after(err) >= 1
    assert shuffler.storage.failures and shuffler.storage.error
    time.sleep(2)  # test writes succeed meanwhile, but the release still fails: no flapping back to SERVING
    assert health(shf.address) == "NOT_SERVING"
    failing.clear()  # the disk works again: a test write succeeds, the release happens, ingest resumes
    wait_for(lambda: health(shf.address) == "SERVING")
    wait_for(lambda: set(sink.tags()) == {tag_of(r.payload) for r in first})
    assert len(_submit(shf.address, [report() for _ in range(3)])) == 3
    wait_for(lambda: len(sink.tags()) == 6)
    unusable = [r for r in caplog.records if "report log unusable" in r.getMessage()]
    assert len(unusable) == 1 and not any(r.exc_info for r in caplog.records)
    assert all(t.done() is False for t in shuffler.tasks)  # no background task ended


def test_stalled_commit_answers_unavailable_then_the_retry_is_a_duplicate(start_shuffler, sink):
    shf = start_shuffler(sink.address, min_batch=1000, commit_timeout_seconds=0.5)
    log = _shuffler(shf).reportlog
    original, disk_back = log.append_groups, threading.Event()

    def stalled(*args):
        disk_back.wait(2 * DEADLINE)  # a hanging disk: the commit ends only when the test lets it
        return original(*args)

    log.append_groups = stalled
    r = report()
    t0 = time.monotonic()
    err = _error(lambda: _submit(shf.address, [r], timeout=DEADLINE))
    assert time.monotonic() - t0 < PROMPT  # after commit_timeout_seconds, not when the commit ends
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "commit_timeout_seconds" in err.details()
    assert health(shf.address) == "NOT_SERVING"
    log.append_groups = original
    disk_back.set()
    wait_for(lambda: health(shf.address) == "SERVING")  # the slow commit finished; a test write worked
    acks = _submit(shf.address, [r])  # the client retries with the same idempotency id
    assert acks[0].status == shuffler_pb2.ACK_STATUS_DUPLICATE


def _open_submit(channel, metadata=()):
    """A Submit call whose request message is never sent (a client-streaming call on the unary method: the
    server cannot tell it from a sender that has not finished its message)."""
    call = channel.stream_unary("/lac.v1.Shuffler/Submit", request_serializer=None, response_deserializer=None)
    never = threading.Event()

    def nothing():
        never.wait(2 * DEADLINE)
        yield from ()

    return call.future(nothing(), metadata=metadata, timeout=DEADLINE), never


def test_a_caller_is_authenticated_before_its_request_is_received(start_shuffler, sink, tmp_path):
    """Issue 23, item 4: the shuffler read a whole message (up to 64 MiB) before it checked the token."""
    shf = start_shuffler(sink.address, min_batch=1000, auth="token", state_dir=tmp_path / "auth-first")
    with grpc.insecure_channel(shf.address) as ch:
        future, never = _open_submit(ch)  # no token, and no message yet: refused at once
        try:
            err = _error(lambda: future.result(DEADLINE))
        finally:
            never.set()
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err


def test_a_request_not_received_in_time_is_unavailable(start_shuffler, sink, tmp_path):
    from lac.shuffler.auth import add_client

    state = tmp_path / "slow"
    token = add_client(state / "clients.tokens", "slow")
    shf = start_shuffler(sink.address, min_batch=1000, auth="token", state_dir=state, receive_timeout_seconds=0.5)
    with grpc.insecure_channel(shf.address) as ch:
        t0 = time.monotonic()
        future, never = _open_submit(ch, (("authorization", f"Bearer {token}"),))
        try:
            err = _error(lambda: future.result(DEADLINE))
        finally:
            never.set()
        assert time.monotonic() - t0 < PROMPT  # after receive_timeout_seconds, not at the call's deadline
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "receive_timeout_seconds=0.5" in err.details()
        assert _retry_after(err) == 1


@pytest.mark.slow
def test_unauthenticated_large_messages_do_not_grow_the_shuffler(tmp_path):
    """Eight concurrent 20 MiB Submits without a token (max_message_bytes raised to 64 MiB, the old default)
    against a real ``lac shuffler serve``: refused before their bytes are received, so its RSS barely moves
    (before the fix it grew by ~290 MiB, 16 x 63 MiB took 1.4 GiB)."""
    from lac_testkit import ServeProc

    from lac.common.v1 import reports_pb2

    args = ["--insecure", "--state-dir", str(tmp_path / "state"), "--curator", "127.0.0.1:1"]
    proc = ServeProc([*args, "--max-message-bytes", str(64 * 2**20)], tmp_path / "run")
    try:
        before = peak = proc.rss_bytes()
        done = threading.Event()

        def watch():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, proc.rss_bytes())
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        big = shuffler_pb2.SubmitRequest(
            reports=[shuffler_pb2.ClientReport(payload=reports_pb2.SealedPayload(data=os.urandom(20 * 2**20)))]
        )
        codes = []

        def send():
            options = [("grpc.max_send_message_length", 64 * 2**20), ("grpc.use_local_subchannel_pool", 1)]
            with grpc.insecure_channel(proc.address, options=options) as ch:
                try:
                    shuffler_pb2_grpc.ShufflerStub(ch).Submit(big, timeout=60)
                except grpc.RpcError as exc:
                    codes.append(exc.code())

        senders = [threading.Thread(target=send) for _ in range(8)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(90)
        time.sleep(0.5)
        done.set()
        watcher.join(5)
    finally:
        proc.stop()
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
    assert peak - before < 64 * 2**20, f"RSS {before / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB"
