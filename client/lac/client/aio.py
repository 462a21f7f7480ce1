"""Submitting reports from asyncio code: ``AsyncShufflerClient``, the ``grpc.aio`` twin of
``lac.client.submit.ShufflerClient``.

Same arguments, same defaults (a call fails at once when a connection attempt fails, and after
``connect_timeout``, 10 s, when none is answered), same errors (``lac.client.errors``, never a raw
``grpc.RpcError``), same retries, failover between several addresses, curator key check and sharded-replica
routing: every step between two I/O operations is the blocking client's own code
(``lac.client.submit._Submitter``); only the RPCs, the pauses between retries and the sealing (off the
event loop, in a thread) are done here, with ``await``::

    from lac.client import AsyncShufflerClient

    async with AsyncShufflerClient.connect(ADDRESS, curator_key="curator.pub", ca="ca.pem", token=TOKEN) as client:
        localizer = await client.localizer("balanced")
        acks = await client.submit(localizer.privatize(message))

Channels are opened on first use, on the running event loop; use one client per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from lac.client.acks import ReportAck
from lac.client.presets import DEFAULT_PRESET, Preset
from lac.client.submit import (
    _T,
    CHANNEL_OPTIONS,
    CONNECT_TIMEOUT,
    HEALTH_CHECK,
    PROBE_SECONDS,
    _Compute,
    _Connecting,
    _Effect,
    _not_reached,
    _reason,
    _Rpc,
    _Sleep,
    _Steps,
    _Submitter,
)
from lac.common import tls
from lac.common.deployment import Deployment
from lac.common.envelope import CuratorPublicKey
from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc

if TYPE_CHECKING:
    from lac.client.localizer import Localizer, PrivatizedReport

__all__ = ["AsyncShufflerClient"]


class AsyncShufflerClient(_Submitter):
    """Submits reports to a shuffler with ``grpc.aio``, many per call, retrying transient failures.

    The arguments, defaults and errors are ``ShufflerClient``'s: ``curator_key`` and ``tls_config``
    (or ``insecure=True`` for a local demo), a bearer ``token``, ``batch_size`` reports per call,
    ``attempts``, ``timeout`` per call and ``connect_timeout`` (a call whose connection attempt fails, or
    that has no connection by then, fails with ``RetryableError`` naming the address and why).
    ``AsyncShufflerClient.connect`` builds the same from file paths. Use it as ``async with``, or
    ``await client.close()``.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        curator_key: CuratorPublicKey | None = None,
        tls_config: tls.ClientTls | None = None,
        token: str | None = None,
        insecure: bool = False,
        batch_size: int = 100,
        attempts: int = 5,
        timeout: float = 30.0,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        super().__init__(
            target, curator_key, tls_config, token, insecure, batch_size, attempts, timeout, connect_timeout
        )
        self._given: dict[str, tuple[grpc.aio.Channel, shuffler_pb2_grpc.ShufflerStub]] = {}  # opened on first use
        self._evicted: list[grpc.aio.Channel] = []  # replica channels to close

    @classmethod
    def connect(
        cls,
        address: str | Sequence[str],
        *,
        curator_key: str | os.PathLike[str] | CuratorPublicKey | None = None,
        ca: str | os.PathLike[str] | None = None,
        token: str | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        insecure: bool = False,
        **options: Any,
    ) -> AsyncShufflerClient:
        """A client of the shuffler at ``address`` (or a list of its replicas') from files, as
        ``ShufflerClient.connect``: ``curator_key`` (``curator.pub``), ``ca``, optionally ``cert``/``key``, the
        bearer ``token`` (default: ``$LAC_CLIENT_TOKEN``); ``options`` go to the constructor. Nothing connects
        until the first call."""
        public, channel_tls, token = cls._from_files(
            curator_key, ca, token, cert, key, insecure, f"{cls.__name__}.connect"
        )
        return cls(address, public, channel_tls, token=token, insecure=insecure, **options)

    async def close(self) -> None:
        """Close the channels to the addresses given and to every replica."""
        with self._lock:
            channels = [ch for ch, _ in [*self._replicas.values(), *self._given.values()]] + self._evicted
            self._replicas, self._given, self._evicted = OrderedDict(), {}, []
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncShufflerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the I/O of the shared steps

    async def _run(self, steps: _Steps[_T]) -> _T:
        """Run the shared ``steps`` to their value, awaiting each effect."""
        try:
            effect = next(steps)
            while True:
                try:
                    result = await self._perform(effect)
                except Exception as exc:  # an RPC's failure: the steps decide (retry, wrap, give up)
                    effect = steps.throw(exc)
                else:
                    effect = steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()

    async def _perform(self, effect: _Effect) -> Any:
        if isinstance(effect, _Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        if isinstance(effect, _Compute):
            return await asyncio.to_thread(effect.work)
        channel, stub = self._at(effect.address)
        method = getattr(stub, effect.method)
        if effect.quick is not None:
            return await method(effect.request, metadata=effect.metadata, timeout=effect.quick)
        return await self._attempt(effect, channel, method)

    def _at(self, address: str) -> tuple[grpc.aio.Channel, shuffler_pb2_grpc.ShufflerStub]:
        """The channel and stub to ``address`` (opened on first use, on the running loop)."""

        def make(to: str) -> tuple[grpc.aio.Channel, shuffler_pb2_grpc.ShufflerStub]:
            channel = tls.channel(to, self.tls_config, CHANNEL_OPTIONS, aio=True)
            return channel, shuffler_pb2_grpc.ShufflerStub(channel)

        if address in self.targets:
            if address not in self._given:
                self._given[address] = make(address)
            return self._given[address]
        entry, evicted = self._replica_entry(address, make)
        if evicted is not None:
            self._evicted.append(evicted[0])  # closed by close(): a call may still run on it
        return entry

    async def _attempt(self, rpc: _Rpc, channel: grpc.aio.Channel, method: Any) -> Any:
        """One call, sent fail-fast once the channel is connected (``_connect``), as ``ShufflerClient``'s."""
        await self._connect(rpc.address, channel, f"Shuffler.{rpc.method}")
        return await method(rpc.request, timeout=self.timeout, wait_for_ready=False, metadata=rpc.metadata)

    async def _connect(self, address: str, channel: grpc.aio.Channel, what: str) -> None:
        """Wait for ``channel`` to be connected until ``_Connecting`` gives up, as ``ShufflerClient``'s: then
        ``RetryableError`` (UNAVAILABLE) says the address and why."""
        connecting = _Connecting(self.connect_timeout, address in self._failing)
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            connecting.see(state)
            verdict = connecting.verdict()
            if verdict is not None:
                why = await self._why(channel, verdict)
                if why is None:  # connected since the attempt failed
                    break
                self._failing.add(address)
                raise _not_reached(address, self.connect_timeout if verdict == "timeout" else None, what, why)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(channel.wait_for_state_change(state), connecting.wait())
            state = channel.get_state(try_to_connect=True)
        self._failing.discard(address)

    async def _why(self, channel: grpc.aio.Channel, verdict: str) -> str | None:
        """``ShufflerClient``'s reason for a channel that did not connect, asked with a fail-fast call."""
        probe: Any = channel.unary_unary(HEALTH_CHECK)  # raw bytes: any answer will do
        try:
            await probe(b"", timeout=PROBE_SECONDS, wait_for_ready=False)
            failure = None
        except grpc.RpcError as exc:
            failure = exc
        return _reason(failure, verdict)

    # -- the API: ShufflerClient's, awaited

    async def deployment(self) -> Deployment:
        """The curator's published local-privacy configuration, relayed by the shuffler."""
        return await self._run(self._deployment())

    async def localizer(self, preset: str | Preset | None = DEFAULT_PRESET, **options: Any) -> Localizer:
        """A Localizer for the curator's current deployment (``ShufflerClient.localizer``); the embedding
        loads in a thread, off the event loop."""
        from lac.client.localizer import Localizer

        deployment = await self.deployment()
        return await asyncio.to_thread(Localizer.for_deployment, deployment, preset, **options)

    async def submit(
        self, reports: Iterable[PrivatizedReport] | PrivatizedReport, token: str | None = None
    ) -> list[ReportAck]:
        """Submit ``reports`` (or one report), sealed in a thread; one ``ReportAck`` per report, and
        ``QuotaExceeded`` with the acks of those stored when the quota runs out (``ShufflerClient.submit``).
        ``token`` overrides this client's token for this call."""
        return await self._run(self._submit(reports, token))

    async def submit_prepared(
        self, chunk: Sequence[shuffler_pb2.ClientReport], token: str | None = None
    ) -> list[ReportAck]:
        """Submit already sealed reports as one request (a retry reuses their idempotency ids, so it stores
        nothing twice); acks and the quota as ``submit``."""
        return await self._run(self._submit_prepared(chunk, token))

    async def check_curator_key(self, key_ids: Iterable[str], token: str | None = None) -> None:
        """``DeploymentMismatch`` unless the curator can open reports sealed to ``key_ids``
        (``ShufflerClient.check_curator_key``)."""
        await self._run(self._check_curator_key(key_ids, token))

    async def replica(self, token: str | None = None) -> str:
        """The address this client (or ``token``'s client) submits to (``ShufflerClient.replica``)."""
        return await self._run(self._replica(token))
