"""The asyncio SDK (``lac.client.AsyncShufflerClient``) against real shufflers: the blocking client's API,
defaults, errors and results, awaited. (Sharded replicas: ``tests/shuffler/test_shards.py`` runs its SDK
tests with both clients.)"""

from __future__ import annotations

import asyncio
import inspect
import time

import grpc
import pytest
from client_testkit import assert_wrapped, privatized, silent_port
from lac_testkit import DEADLINE, PROMPT, free_port

import lac.client
from lac.client import AckStatus, ReportAck, errors

STORED = AckStatus.STORED


def _client(address, **kw):
    kw.setdefault("attempts", 1)
    return lac.client.AsyncShufflerClient(address, insecure=True, timeout=10, **kw)


def test_the_same_api_as_the_blocking_client_awaited():
    sync, aio = lac.client.ShufflerClient, lac.client.AsyncShufflerClient
    public = {n for n in dir(sync) if not n.startswith("_")} - {"close"}
    assert public == {n for n in dir(aio) if not n.startswith("_")} - {"close"}
    for name in public - {"connect"}:
        assert inspect.iscoroutinefunction(getattr(aio, name)), name
        assert inspect.signature(getattr(aio, name)).parameters == inspect.signature(getattr(sync, name)).parameters
    assert inspect.iscoroutinefunction(aio.close)
    assert inspect.signature(aio).parameters == inspect.signature(sync).parameters  # same defaults, fail-fast too
    assert inspect.signature(aio.connect).parameters == inspect.signature(sync.connect).parameters
    with pytest.raises(ValueError, match="connect_timeout"):
        aio("127.0.0.1:1", insecure=True, connect_timeout=0)
    with pytest.raises(ValueError, match="AsyncShufflerClient needs the curator's public key and TLS settings"):
        aio("127.0.0.1:1")


def test_submits_and_raises_the_sdk_errors_of_a_real_shuffler(token_shuffler, glove200):
    shf, tokens = token_shuffler
    empty = privatized(glove200).__class__(
        sentences=(), n_words=0, mechanism="x", epsilon_per_word=1.0, embedding="x", guarantee=None
    )

    async def main():
        for token in ("not-a-token", None):
            async with _client(shf.address, token=token) as c:
                with pytest.raises(lac.client.AuthenticationError) as err:
                    await c.submit([privatized(glove200)])
            assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.UNAUTHENTICATED)
            assert "bearer token" in str(err.value)
        async with _client(shf.address, token=tokens["ops"]) as c:
            with pytest.raises(lac.client.AuthenticationError) as err:
                await c.submit([privatized(glove200)])
            assert_wrapped(err.value, errors.NotRetryableError, grpc.StatusCode.PERMISSION_DENIED)
        async with _client(shf.address, token=tokens["alice"]) as c:
            with pytest.raises(lac.client.UnsupportedText, match="^the report has no word"):
                await c.submit(empty)  # refused on the device: the quota is intact
            assert await c.replica() == shf.address  # not sharded
            with pytest.raises(lac.client.QuotaExceeded) as err:  # one report per window: the first is stored
                await c.submit([privatized(glove200), privatized(glove200, "a second message")])
        assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert 1 <= err.value.retry_after <= 86400 and f"retry after {err.value.retry_after:g} s" in str(err.value)
        assert [a.status for a in err.value.acks] == [STORED]

    asyncio.run(main())
    assert shf.shuffler.buffered() == 1


def test_concurrent_submissions_through_one_client(start_shuffler, sink, tmp_path, glove200):
    """One client, 20 simulated clients' submissions in flight at once on one event loop: each stored once."""
    from lac.shuffler.auth import add_clients

    state = tmp_path / "shuffler"
    tokens = add_clients(state / "clients.tokens", [f"user-{i}" for i in range(20)])
    shf = start_shuffler(sink.address, auth="token", state_dir=state, reports_per_window=1, min_batch=1000)
    reports = [privatized(glove200, f"the king said {i}") for i in range(20)]

    async def main():
        async with _client(shf.address) as c:
            return await asyncio.gather(*(c.submit(r, token=t) for r, t in zip(reports, tokens)))

    acks = asyncio.run(main())
    assert [a.status for chunk in acks for a in chunk] == [STORED] * 20
    assert shf.shuffler.buffered() == 20


async def _unreachable(client, glove200):
    """The error and the seconds of one submit through ``client`` to a shuffler it cannot reach."""
    t0 = time.monotonic()
    with pytest.raises(lac.client.RetryableError) as err:
        await client.submit(privatized(glove200))
    assert_wrapped(err.value, lac.client.RetryableError, grpc.StatusCode.UNAVAILABLE)
    return str(err.value), time.monotonic() - t0


def test_a_refused_connection_fails_at_once_and_a_silent_host_after_connect_timeout(glove200):
    """A closed loopback port: UNAVAILABLE well before the 30 s ``connect_timeout``, naming it and gRPC's reason;
    a peer that never answers: after ``connect_timeout`` (0.5 s), not the call's 30 s."""
    refused = f"127.0.0.1:{free_port()}"

    async def main(address, connect_timeout):
        async with lac.client.AsyncShufflerClient.connect(
            address, insecure=True, connect_timeout=connect_timeout, attempts=5, timeout=DEADLINE
        ) as c:
            return await _unreachable(c, glove200)

    message, seconds = asyncio.run(main(refused, DEADLINE))
    assert seconds < PROMPT, seconds
    assert f"could not connect to the shuffler at {refused}: " in message and "Connection refused" in message
    with silent_port() as silent:
        message, seconds = asyncio.run(main(silent, 0.5))
    assert 0.5 <= seconds < PROMPT, seconds
    assert f"could not reach the shuffler at {silent} within 0.5 s: no answer" in message, message


def test_a_shuffler_back_after_a_refusal_is_reached_by_the_same_client(start_shuffler, sink, glove200):
    port = free_port()

    async def main():
        async with _client(f"127.0.0.1:{port}", connect_timeout=DEADLINE) as c:
            message, _ = await _unreachable(c, glove200)
            assert "Connection refused" in message
            start_shuffler(sink.address, port=port, min_batch=1000)
            return await c.submit(privatized(glove200))

    (ack,) = asyncio.run(main())
    assert isinstance(ack, ReportAck) and ack.status == STORED


def test_a_transient_failure_is_retried_then_raised(start_shuffler, monkeypatch):
    import lac.client.submit

    monkeypatch.setattr(lac.client.submit, "MAX_RETRY_WAIT", 0.1)  # the shared retry policy, not the 5 s asked
    shf = start_shuffler("127.0.0.1:1", min_batch=1000)  # the curator is unreachable: no deployment yet

    async def main():
        async with _client(shf.address, attempts=2) as c:
            with pytest.raises(lac.client.RetryableError) as err:
                await c.deployment()
        return err.value

    exc = asyncio.run(main())
    assert_wrapped(exc, errors.RetryableError, grpc.StatusCode.UNAVAILABLE)
    assert exc.retry_after == 5 and "Shuffler.GetDeployment" in str(exc)


def test_tls_connect_localizer_and_the_curator_key_check(tls_services, data_dir, tmp_path, monkeypatch):
    """The README's submit lines, awaited: TLS, the curator's key, a token from the environment; a key the
    curator does not hold is refused before anything is sealed or sent."""
    from lac.common import envelope

    address, files, token = tls_services
    monkeypatch.setenv("LAC_CLIENT_TOKEN", token)
    envelope.generate_key(tmp_path / "other")

    async def main():
        async with lac.client.AsyncShufflerClient.connect(
            address, curator_key=files / "curator.pub", ca=files / "ca.pem"
        ) as client:
            published = await client.deployment()
            localizer = await client.localizer("balanced")
            acks = await client.submit(localizer.privatize("hello world. my name is Bob and I live in Paris."))
        async with lac.client.AsyncShufflerClient.connect(
            address, curator_key=tmp_path / "other" / "curator.pub", ca=files / "ca.pem"
        ) as wrong:
            with pytest.raises(lac.client.DeploymentMismatch, match="Nothing was sent"):
                await wrong.submit(localizer.privatize("another message"))
        return published, localizer, acks

    published, localizer, acks = asyncio.run(main())
    assert len(published.key_ids) == 1 and localizer.mechanism.epsilon == 8.0
    assert [a.status for a in acks] == [STORED]
    with pytest.raises(ValueError, match="TLS needs the CA"):
        lac.client.AsyncShufflerClient.connect(address, curator_key=files / "curator.pub")
