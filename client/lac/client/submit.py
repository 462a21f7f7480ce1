"""Sending privatized reports to the shuffler.

Each report gets a fresh random report id (inside the sealed content, for the curator's
replay protection) and a separate random idempotency id (outside, for the shuffler):
the shuffler never sees the id the curator sees. Retrying a call reuses the same
idempotency ids, so a retry is stored once. Content is HPKE-sealed to the curator's
public key; the channel is TLS and the client authenticates with a bearer token (or
an mTLS certificate). Plaintext payloads and channels need ``insecure=True``.

Several addresses (failover): ``ShufflerClient(["a:50051", "b:50051"], ...)`` takes the addresses of
replicas of one shuffler. A call goes to one of them (a random one first, then the last that answered);
when it cannot connect, or the replica answers UNAVAILABLE (down, draining in a graceful shutdown, its
storage failing) or DEADLINE_EXCEEDED, the same request, with the same idempotency ids, goes to the next
address at once. Only when every address failed does the client wait (the back-off, at least the smallest
``retry-after-seconds`` when every replica asked for one) and try them all again, up to ``attempts``
rounds; the error then names every address and why it failed (at once when none could be connected to).
Any other answer (a refusal of the token, of the report, the quota) is the answer, never asked elsewhere.
A Submit that may have been stored (DEADLINE_EXCEEDED, CANCELLED, a connection lost after sending, an UNAVAILABLE
without the shuffler's ``nothing_stored`` reason) goes on only to an address that reported the same report log
(``GetShards``' ``store_id``, asked once per address), else to the same address again: never into a second log.
Every replica listed must take every client: replicas of one database, not sharded (``GetShards`` lists no
shards). An address may also be a DNS name with several addresses (or gRPC's ``ipv4:host:port,host:port``):
gRPC connects to one of them, in a random order per channel (``pick_first`` with ``shuffleAddressList``),
and the retry after a failure connects to the next.

Sharded shufflers: when the operator runs several replicas, each client belongs to one of them
(``Shuffler.GetShards`` says which). The addresses given to ``ShufflerClient`` are then only
bootstraps (asked in turn, as above): before a token's first submission the client asks one for that
token's replica and submits there (same TLS settings and token); a replica that refuses a client it does
not serve names the right one (FAILED_PRECONDITION with trailing metadata ``lac-shard``), and the client
asks that replica and retries there once. A client's replica that is down fails its calls: no other replica
may take its reports (each counts its own clients' quota). Replicas must agree on the shard list: the
client submits through a bootstrap whose list every replica in it reports too (the digest ``GetShards``
gives, asked of each replica once, with a short timeout: one that cannot answer now is asked again later),
else raises ``NotRetryableError`` saying the lists differ, and it sends that digest with each Submit
(metadata ``lac-shards-digest``): a replica with another list refuses it, and the client asks a
bootstrap again once (the list may have changed at a window boundary). Against an unsharded
shuffler every call goes to the addresses given, as said above.

Connecting: a call waits for a connection to the shuffler at most ``connect_timeout`` seconds (10 by
default), for a host that does not answer. A connection attempt that fails (refused, no route, a name that
does not resolve, a refused TLS handshake) fails the call at once instead, as ``RetryableError``
(UNAVAILABLE) naming the address and gRPC's reason: waiting would not help, and nothing was sent. The one
exception is a channel whose last attempt had failed before the call: the call gives gRPC's next attempt
(the SDK's channels retry a failed connection after at most 1 s, not gRPC's default of up to 2 minutes; the
call gives it ``STALE_GRACE``, 2 s) its chance, so a shuffler that has come back is reached. With several
addresses, it is that address's attempt that fails at once: the call goes on at the next. Once connected, the
call is sent fail-fast: one that loses its connection before it is sent (the replica went away, or drains and
refuses new calls) fails at once, UNAVAILABLE, instead of waiting for another connection until its deadline,
while one already sent finishes on its connection as the replica drains.

Failures surface as ``lac.client.errors`` (never a raw ``grpc.RpcError``): a shuffler that cannot be
reached as said above, at once; other transient ones (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED: this SDK
cancels no call, so the server did, e.g. one it had not started when it began to shut down)
after this client's own retries as ``RetryableError``; a used-up quota as ``QuotaExceeded``, after storing as many
of the reports, in order, as the quota allows (its ``acks``); credentials as ``AuthenticationError``,
refused input as ``InvalidReportError``; replicas that keep sending a client elsewhere as
``NotRetryableError``. Each report stored is acknowledged with a ``lac.client.ReportAck``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from random import randrange
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import Message

from lac.client import _grpc_errors
from lac.client._grpc_errors import retry_after, trailing_of, wrap
from lac.client.acks import AckStatus, ReportAck
from lac.client.errors import (
    DeploymentMismatch,
    LacClientError,
    Metadata,
    QuotaExceeded,
    RetryableError,
    UnsupportedText,
)
from lac.client.presets import DEFAULT_PRESET, Preset
from lac.common import envelope, retry, tls, tracing
from lac.common.deployment import Deployment
from lac.common.envelope import CuratorPublicKey
from lac.common.errors import ERROR_REASON_KEY, ErrorReason, InvalidArgument
from lac.common.serde import deployment_from_proto, mechanism_id
from lac.common.v1 import reports_pb2, shuffler_pb2, shuffler_pb2_grpc

if TYPE_CHECKING:
    from lac.client.localizer import Localizer, PrivatizedReport

# CANCELLED: this SDK cancels no call, so the server did: e.g. one it had received but not started when it began to
# shut down. Like any retry, it is sent again with the same idempotency ids.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
FIRST_RETRY_WAIT = 0.2  # seconds: the back-off's first ceiling (then doubling; waits are drawn below it)
MAX_RETRY_WAIT = 30.0  # seconds: the longest the SDK sleeps between two attempts
TOKEN_ENV = "LAC_CLIENT_TOKEN"
SHARD_KEY = "lac-shard"  # trailing metadata of a sharded replica's refusal: the replica to submit to
SHARDS_DIGEST_KEY = "lac-shards-digest"  # a Submit's: the bootstrap's shard list; a refusal's: the replica's
MAX_ROUTES = 4096  # tokens whose replica is remembered (a simulation may play many clients)
MAX_REPLICA_CHANNELS = 64  # open channels to replicas other than the bootstrap
LIST_CHECK_SECONDS = 2.0  # how long the SDK waits for a replica's shard-list digest before asking it later
CONNECT_TIMEOUT = 10.0  # seconds: how long a call waits for a connection before the SDK gives up
PROBE_SECONDS = 1.0  # a fail-fast call that asks gRPC why a channel in TRANSIENT_FAILURE cannot connect
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # the probe's method
# gRPC retries a failed connection after 1 s, then 1.6 times longer each time, up to 2 minutes: a channel
# whose shuffler was down would fail calls for that long after it is back. The SDK's wait at most 1 s.
# A name with several addresses: each channel connects to one of them at random (gRFC A62), not all to the first.
_PICK_FIRST_SHUFFLED = json.dumps({"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": True}}]})
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.service_config", _PICK_FIRST_SHUFFLED),
)
STALE_GRACE = 2.0  # seconds: a call on a channel that failed before it waits this long for a new attempt (1 s ± 20%)
ANY = ""  # the route "any of the addresses given": a call tries them in turn (failover)
_ACK_STATUS = {shuffler_pb2.ACK_STATUS_STORED: AckStatus.STORED, shuffler_pb2.ACK_STATUS_DUPLICATE: AckStatus.DUPLICATE}


def _backoff() -> retry.Backoff:
    """The SDK's back-off between attempts (read when a call starts, so ``MAX_RETRY_WAIT`` may be changed)."""
    return retry.Backoff(initial=min(FIRST_RETRY_WAIT, MAX_RETRY_WAIT), maximum=MAX_RETRY_WAIT)


def _bearer(token: str | None) -> Metadata:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _named_shard(error: LacClientError) -> str | None:
    """The replica a wrong-shard refusal (FAILED_PRECONDITION with ``lac-shard``) sends the client to."""
    if error.status_code != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    return next((value for key, value in error.trailing if key == SHARD_KEY and isinstance(value, str) and value), None)


def _refused_for_its_list(error: LacClientError) -> bool:
    """Whether ``error`` is a replica's refusal of a Submit routed by another shard list than its own."""
    return error.status_code == grpc.StatusCode.FAILED_PRECONDITION and any(
        key == SHARDS_DIGEST_KEY for key, _ in error.trailing
    )


def _lists_differ(bootstrap: str, digest: str, replica: str, other: str) -> LacClientError:
    """The error for a replica whose shard list is not the bootstrap's: it could take a client another
    replica also takes (two quotas), so nothing is sent to it."""
    return _grpc_errors.NotRetryableError(
        f"Shuffler.Submit failed: FAILED_PRECONDITION: the shuffler replicas' shard lists differ ({bootstrap} "
        f"has digest {digest[:16] or 'none: not sharded'}, {replica} has {other[:16] or 'none: not sharded'}): "
        f"tell the shuffler's operator; nothing was sent",
        status_code=grpc.StatusCode.FAILED_PRECONDITION,
        status_details="shard lists differ",
    )


def _replicas_disagree(why: str, refusal: LacClientError) -> LacClientError:
    """The error for a wrong-shard refusal that following it did not resolve (inconsistent shard lists)."""
    return _grpc_errors.NotRetryableError(
        f"Shuffler.Submit failed: FAILED_PRECONDITION: the shuffler replicas disagree about this client's replica "
        f"({why}): their shard lists differ, tell the shuffler's operator. Last refusal: {refusal.status_details}",
        status_code=refusal.status_code,
        status_details=refusal.status_details,
        trailing=refusal.trailing,
    )


def _reason(exc: grpc.RpcError | None, verdict: str) -> str | None:
    """Why a channel did not connect, from a fail-fast probe's failure after ``_Connecting``'s ``verdict``;
    None when the probe was answered after a failed attempt (connected since: the call goes on)."""
    if exc is None:
        return None if verdict == "failed" else "it answered only after the wait"
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return exc.details() or "unavailable"
    # still connecting: nothing refused the connection, nothing answered it either
    return "no answer to the connection attempt (a host that is down, or a firewall dropping it)"


def _why(channel: grpc.Channel, verdict: str) -> str | None:
    """``_reason`` of a channel that did not connect, asked with a fail-fast call (a failed attempt's reason
    at once; a silent one is said to be unanswered)."""
    try:
        probe: Any = channel.unary_unary(HEALTH_CHECK)  # raw bytes: any answer will do
        probe(b"", timeout=PROBE_SECONDS, wait_for_ready=False)
        failure = None
    except grpc.RpcError as exc:
        failure = exc
    return _reason(failure, verdict)


def _addresses(target: str | Sequence[str]) -> tuple[str, ...]:
    """The addresses of ``target``: one address, or a list of replicas' (ValueError if empty or repeated)."""
    addresses = (target,) if isinstance(target, str) else tuple(target)
    if not addresses or not all(isinstance(a, str) and a for a in addresses):
        raise ValueError(f"a shuffler address, or a list of its replicas' addresses, is needed; got {target!r}")
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(f"shuffler address {', '.join(repeated)} given more than once")
    return addresses


def _none_took(what: str, failures: Sequence[tuple[str, grpc.RpcError]], pinned: str | None = None) -> LacClientError:
    """The error for a call that every address in ``failures`` failed (address, its error: an SDK error when it
    could not be connected to, else the replica's answer): one address's own error, or one naming each; with
    ``pinned``, the address that may have stored the call, which alone was asked again."""
    errors = [(at, exc if isinstance(exc, LacClientError) else wrap(exc, what)) for at, exc in failures]
    if pinned is not None:
        last = _none_took(what, failures)
        return _grpc_errors.RetryableError(
            f"{what} failed: {last.status_code.name}: {pinned} may have stored these reports and no other address "
            f"reported its report log (GetShards' store_id), so it alone was asked again: {last.status_details}; "
            f"retry later with the same idempotency ids",
            status_code=last.status_code,
            status_details=last.status_details,
            retry_after=getattr(last, "retry_after", None),
        )
    if len(errors) == 1:
        return errors[0][1]
    unreached = [isinstance(exc, LacClientError) for _, exc in failures]
    reasons = "; ".join(
        f"{at}: not reached ({exc.status_details})"
        if far
        else f"{at}: {exc.status_code.name}: {exc.status_details}"
        + (f" (retry after {exc.retry_after:g} s)" if isinstance(exc, RetryableError) and exc.retry_after else "")
        for (at, exc), far in zip(errors, unreached)
    )
    waits = [getattr(exc, "retry_after", None) for _, exc in errors]
    timed_out = all(exc.status_code == grpc.StatusCode.DEADLINE_EXCEEDED for _, exc in errors)
    code = grpc.StatusCode.DEADLINE_EXCEEDED if timed_out else grpc.StatusCode.UNAVAILABLE
    return _grpc_errors.RetryableError(
        f"{what} failed: {code.name}: none of the {len(errors)} shuffler addresses took the call: {reasons}"
        + ("; nothing was sent" if all(unreached) else ""),
        status_code=code,
        status_details=reasons,
        retry_after=_floor(waits),
    )


def _may_have_stored(exc: grpc.RpcError) -> bool:
    """Whether a failed Submit may have stored its reports: not when it was never sent (the SDK's own error: no
    connection) or the shuffler refused it saying so (UNAVAILABLE with ``ErrorReason.NOTHING_STORED``); after a
    deadline, a cancellation, a connection lost once it was sent or any other UNAVAILABLE, it may."""
    if isinstance(exc, LacClientError):
        return False
    reason = dict(trailing_of(exc)).get(ERROR_REASON_KEY)
    return not (exc.code() == grpc.StatusCode.UNAVAILABLE and reason == ErrorReason.NOTHING_STORED)


def _floor(waits: Sequence[float | None]) -> float | None:
    """The smallest of ``waits`` (the replicas' ``retry-after-seconds``), None when one of them asked for none:
    that replica may take a call again at any time."""
    asked = [w for w in waits if w is not None]
    return min(asked) if asked and len(asked) == len(waits) else None


def _not_reached(address: str, seconds: float | None, what: str, why: str) -> LacClientError:
    """The error for a call whose channel to ``address`` did not connect, saying ``why``: within ``seconds``
    (None: a connection attempt failed)."""
    if seconds is None:
        message = f"could not connect to the shuffler at {address}: {why}; nothing was sent"
    else:
        message = (
            f"could not reach the shuffler at {address} within {seconds:g} s: {why} "
            "(ShufflerClient(connect_timeout=...) waits longer)"
        )
    return _grpc_errors.RetryableError(
        f"{what} failed: UNAVAILABLE: {message}", status_code=grpc.StatusCode.UNAVAILABLE, status_details=why
    )


class _Connecting:
    """When a call waiting for its channel to connect gives up (see the module's docstring), from the
    channel's states as they are seen (``see``) and the time: ``verdict`` is "failed" (a connection
    attempt of this call failed), "timeout" (no connection within ``connect_timeout``) or None (wait at
    most ``wait()`` seconds more for a state). ``stale``: the channel's last attempt failed before the call."""

    def __init__(self, connect_timeout: float, stale: bool) -> None:
        now = time.monotonic()
        self.deadline = now + connect_timeout
        self.fresh_from = now + STALE_GRACE if stale else now  # a TRANSIENT_FAILURE from then on is this call's
        self.state: grpc.ChannelConnectivity | None = None

    def see(self, state: grpc.ChannelConnectivity) -> None:
        if state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:  # a new attempt: its failure would be this call's
            self.fresh_from = min(self.fresh_from, time.monotonic())
        self.state = state

    def verdict(self) -> str | None:
        now = time.monotonic()
        if self.state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and now >= self.fresh_from:
            return "failed"
        return "timeout" if now >= self.deadline else None

    def wait(self) -> float:
        until = self.deadline
        if self.state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            until = min(until, self.fresh_from)
        return max(0.0, until - time.monotonic())


def report_content(report: PrivatizedReport) -> reports_pb2.ReportContent:
    """What the curator will read: a fresh report id, the perturbed words and the typed local
    parameters (mechanism, ε per word, embedding id), nothing else."""
    return reports_pb2.ReportContent(
        report_id=os.urandom(envelope.REPORT_ID_BYTES),
        sentences=[reports_pb2.Sentence(tokens=list(s)) for s in report.sentences],
        local_privacy=reports_pb2.LocalPrivacy(
            mechanism=mechanism_id(report.mechanism),  # type: ignore[arg-type]
            # (the generated stub types enum fields as the enum class; the
            # int id is what protobuf takes)
            epsilon_per_word=report.epsilon_per_word,
            embedding=report.embedding,
        ),
    )


def _acks(reply: shuffler_pb2.SubmitResponse, sent: int) -> list[ReportAck]:
    """The typed acks of a Submit reply to ``sent`` reports."""
    if len(reply.acks) != sent or any(a.status not in _ACK_STATUS for a in reply.acks):
        raise _grpc_errors.NotRetryableError(
            f"Shuffler.Submit answered {len(reply.acks)} acks to {sent} reports, or acks of a status this SDK does "
            "not know: not a shuffler this SDK understands",
            status_code=grpc.StatusCode.INTERNAL,
            status_details="malformed acks",
        )
    return [ReportAck(_ACK_STATUS[a.status], a.idempotency_id) for a in reply.acks]


def _check_epsilons(reports: Sequence[PrivatizedReport], published: Deployment) -> None:
    """``DeploymentMismatch`` naming the first report made at an ε per word the ``published`` deployment does not
    accept (its curator would quarantine it; nothing is sent)."""
    for i, r in enumerate(reports):
        if not published.accepts_epsilon(r.epsilon_per_word):
            raise DeploymentMismatch(
                f"report {i} was made at ε = {r.epsilon_per_word:g} per word, but the curator's deployment accepts "
                f"{published.epsilon_rule()} (its curator would quarantine it): privatize with client.localizer(), "
                f"which follows the deployment. Nothing was sent"
            )


def client_report(report: PrivatizedReport, curator_key: CuratorPublicKey | None) -> shuffler_pb2.ClientReport:
    """A report ready for the shuffler: sealed to ``curator_key`` (None = plaintext, demos only).
    A report without words is refused here (``UnsupportedText``): it would spend a quota for nothing."""
    if not any(report.sentences):
        raise UnsupportedText("the report")
    content = report_content(report)
    payload = envelope.seal(content, curator_key) if curator_key else envelope.seal_insecure(content)
    return shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=payload)


def _quiesce(channel: grpc.Channel, limit: float = 1.0) -> None:
    """Wait (at most ``limit`` s) until gRPC's connectivity poller of ``channel`` has stopped: after the
    last ``unsubscribe`` it runs one more 0.2 s watch, and closing the channel under it makes that thread
    raise "Channel closed!"."""
    state = getattr(channel, "_connectivity_state", None)  # grpc's private poller state; absent: nothing runs
    deadline = time.monotonic() + limit
    while state is not None and getattr(state, "polling", False) and time.monotonic() < deadline:
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------- shared logic
#
# Everything a client does between two I/O operations (validation, sealing, retry policy, the curator key
# check, finding and following a token's replica, the shard-list checks) is written once, as generators
# that yield what they need done: an RPC attempt (``_Rpc``), a pause (``_Sleep``) or CPU work
# (``_Compute``). ``ShufflerClient`` performs them with blocking gRPC, ``lac.client.aio.AsyncShufflerClient``
# with grpc.aio; a failed RPC is thrown back into the generator as the grpc.RpcError it raised.


@dataclass(frozen=True)
class _Rpc:
    """One attempt of ``Shuffler.<method>`` at ``address``: waiting at most ``connect_timeout`` for a
    connection (then ``RetryableError`` naming the address and why), or with ``quick`` seconds a plain
    call that fails at once without a connection (a question that may go unanswered)."""

    address: str
    method: str
    request: Message
    metadata: Metadata
    quick: float | None = None


@dataclass(frozen=True)
class _Sleep:
    """Wait ``seconds`` before the next attempt."""

    seconds: float


@dataclass(frozen=True)
class _Compute:
    """CPU work (sealing a chunk): a blocking client runs it in place, an asyncio one off the event loop."""

    work: Callable[[], Any]


_Effect = _Rpc | _Sleep | _Compute
_T = TypeVar("_T")
_Steps = Generator[_Effect, Any, _T]
_Entry = TypeVar("_Entry")


def _steps_of(steps: _Steps[_T], perform: Callable[[_Effect], Any]) -> _T:
    """Run ``steps`` to its value, performing each effect with ``perform`` (blocking)."""
    try:
        effect = next(steps)
        while True:
            try:
                result = perform(effect)
            except Exception as exc:  # an RPC's failure: the steps decide (retry, wrap, give up)
                effect = steps.throw(exc)
            else:
                effect = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()


def _as_list(reports: Iterable[PrivatizedReport] | PrivatizedReport) -> Iterable[PrivatizedReport]:
    return reports if isinstance(reports, Iterable) else [reports]  # a single PrivatizedReport


def _sealed(chunk: list[PrivatizedReport], curator_key: CuratorPublicKey | None) -> list[shuffler_pb2.ClientReport]:
    return [client_report(r, curator_key) for r in chunk]


class _Submitter:
    """What ``ShufflerClient`` and ``AsyncShufflerClient`` share: their settings, the routes learnt
    (token -> replica, shard-list digests, the curator's key ids) and every step between two I/O
    operations, as generators of ``_Effect`` (see above). Not used directly."""

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
        self.targets = _addresses(target)
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
        if not insecure and (curator_key is None or tls_config is None):
            raise ValueError(
                f"{type(self).__name__} needs the curator's public key and TLS settings (or insecure=True for a "
                "local demo)"
            )
        self.curator_key = curator_key
        self.target = self.targets[0]  # the first address given
        self._first = randrange(len(self.targets))  # the address tried first: the last that answered
        self.tls_config = tls_config
        self.token = token
        self.metadata = _bearer(token)
        self.batch_size = batch_size
        self.attempts = attempts
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._unsharded = False  # the bootstrap said it is not sharded: submit there without asking
        self._replica_of: OrderedDict[str | None, str] = OrderedDict()  # token -> its replica's address
        self._digest_of: dict[str, str] = {}  # replica address (ANY: a bootstrap) -> its shard list's digest
        self._bootstrap_list: tuple[tuple[str, ...], str, str] = ((), "", "")  # its shard list, entry and address
        self._replicas: OrderedDict[str, Any] = OrderedDict()  # address -> (channel, stub) of replicas
        self._lock = threading.Lock()
        self._curator_key_ids: frozenset[str] | None = None  # published by the curator's deployment, once asked
        self._published: Deployment | None = None  # that deployment (its ε rule checks each report)
        self._failing: set[str] = set()  # addresses whose channel's last connection attempt failed
        self._store_of: dict[str, str] = {}  # address -> the report log id it reported (GetShards' store_id)

    @staticmethod
    def _from_files(
        curator_key: str | os.PathLike[str] | CuratorPublicKey | None,
        ca: str | os.PathLike[str] | None,
        token: str | None,
        cert: str | os.PathLike[str] | None,
        key: str | os.PathLike[str] | None,
        insecure: bool,
        name: str,
    ) -> tuple[CuratorPublicKey | None, tls.ClientTls | None, str | None]:
        """``connect``'s files read: the curator's key, the TLS settings, the token (default ``$LAC_CLIENT_TOKEN``)."""
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if curator_key is not None and not isinstance(curator_key, CuratorPublicKey):
            curator_key = CuratorPublicKey.load(Path(curator_key))
        channel_tls = tls.client_tls(
            os.fspath(ca or ""), os.fspath(cert or ""), os.fspath(key or ""), insecure=insecure, name=name
        )
        return curator_key, channel_tls, token

    def _replica_entry(self, address: str, make: Callable[[str], _Entry]) -> tuple[_Entry, _Entry | None]:
        """The (channel, stub) entry of a replica other than the bootstrap, made on first use, and the least
        recently used one it evicts past ``MAX_REPLICA_CHANNELS`` (for the caller to close), if any."""
        evicted = None
        with self._lock:
            if address in self._replicas:
                self._replicas.move_to_end(address)
                return self._replicas[address], None
            self._replicas[address] = entry = make(address)
            if len(self._replicas) > MAX_REPLICA_CHANNELS:
                evicted = self._replicas.popitem(last=False)[1]
        return entry, evicted

    # -- the steps

    def _call(
        self, name: str, request: Message, metadata: Metadata | None = None, address: str = ANY, rounds: int = 0
    ) -> _Steps[Any]:
        """``Shuffler.<name>(request)``'s reply, from ``address`` or, by default, from the first address given to
        answer (``_call_at``)."""
        return (yield from self._call_at(name, request, metadata, address, rounds))[1]

    def _call_at(
        self, name: str, request: Message, metadata: Metadata | None = None, address: str = ANY, rounds: int = 0
    ) -> _Steps[tuple[str, Any]]:
        """``Shuffler.<name>(request)`` at ``address`` (ANY: each address given in turn, the last that answered
        first, until one answers), up to ``rounds`` times (0: ``attempts``); the address that answered and its
        reply. A failure to connect, UNAVAILABLE and DEADLINE_EXCEEDED pass the call on to the next address at
        once; when every address failed, the next round waits (``lac.common.retry``'s policy: exponential
        back-off with full jitter, the smallest ``retry-after-seconds`` a floor when every address gave one,
        all up to ``MAX_RETRY_WAIT``). The last round's failures are raised as one ``LacClientError``, at once
        when no address could be connected to (``_Connecting``); any other answer is raised at once.
        A Submit that failed where it may have stored (``_may_have_stored``) goes on only to addresses that
        reported the same report log (``_store_id``), whose idempotency ids then find it, else to the same
        address again: never into a second log."""
        # the app's current OpenTelemetry span, if any, becomes the parent of the shuffler's span of this call
        metadata = (*(self.metadata if metadata is None else metadata), *tracing.inject())
        backoff = _backoff()
        rounds = rounds or self.attempts
        guarded = name == "Submit" and address == ANY and len(self.targets) > 1
        pinned = None  # where a Submit may have stored: only that address's report log may take it now
        for attempt in range(1, rounds + 1):
            failures: list[tuple[str, grpc.RpcError]] = []
            for at in self._in_turn() if address == ANY else (address,):
                if pinned is not None and at != pinned:
                    store = yield from self._store_id(at, metadata)
                    if not store or store != self._store_of.get(pinned, ""):
                        continue
                try:
                    reply = yield _Rpc(at, name, request, metadata)
                except grpc.RpcError as exc:
                    if exc.code() not in RETRYABLE:
                        raise wrap(exc, f"Shuffler.{name}") from None
                    failures.append((at, exc))  # an SDK error: it could not be connected to
                    if guarded and pinned is None and _may_have_stored(exc):
                        pinned = at
                    continue
                if guarded and at not in self._store_of:  # known before a call there fails where it may have stored
                    yield from self._store_id(at, metadata)
                if address == ANY:
                    self._first = self.targets.index(at)
                return at, reply
            never_sent = pinned is None and all(isinstance(exc, LacClientError) for _, exc in failures)
            if attempt == rounds or never_sent:
                raise _none_took(f"Shuffler.{name}", failures, pinned)
            waits = [None if isinstance(exc, LacClientError) else retry_after(trailing_of(exc)) for _, exc in failures]
            yield _Sleep(backoff.delay(attempt, _floor(waits)))
        raise AssertionError("unreachable")

    def _store_id(self, address: str, metadata: Metadata) -> _Steps[str]:
        """The id of the report log behind ``address`` (``GetShards``' ``store_id``), asked once and remembered;
        "" while it cannot be asked (asked again next time) or from a shuffler too old to say."""
        if address not in self._store_of:
            try:
                reply = yield _Rpc(
                    address, "GetShards", shuffler_pb2.GetShardsRequest(), metadata, quick=LIST_CHECK_SECONDS
                )
            except grpc.RpcError:
                return ""
            self._store_of[address] = reply.store_id
        return self._store_of[address]

    def _in_turn(self) -> tuple[str, ...]:
        """The addresses given, from the one to try first."""
        first = self._first
        return self.targets[first:] + self.targets[:first]

    def _deployment(self) -> _Steps[Deployment]:
        return deployment_from_proto((yield from self._call("GetDeployment", reports_pb2.DeploymentRequest())))

    def _submit(
        self, reports: Iterable[PrivatizedReport] | PrivatizedReport, token: str | None
    ) -> _Steps[list[ReportAck]]:
        if self.curator_key is not None:  # before sealing anything to it
            yield from self._check_curator_key([self.curator_key.key_id], token)
        reports = list(_as_list(reports))
        if self._published is not None:
            _check_epsilons(reports, self._published)
        acks: list[ReportAck] = []
        chunk: list[PrivatizedReport] = []
        try:
            for r in reports:
                chunk.append(r)
                if len(chunk) == self.batch_size:
                    sealed = yield _Compute(functools.partial(_sealed, chunk, self.curator_key))
                    acks.extend((yield from self._submit_prepared(sealed, token)))
                    chunk = []
            if chunk:
                sealed = yield _Compute(functools.partial(_sealed, chunk, self.curator_key))
                acks.extend((yield from self._submit_prepared(sealed, token)))
        except QuotaExceeded as exc:
            exc.acks = (*acks, *exc.acks)  # the earlier chunks' too
            raise
        return acks

    def _submit_prepared(
        self, chunk: Sequence[shuffler_pb2.ClientReport], token: str | None
    ) -> _Steps[list[ReportAck]]:
        try:
            return _acks((yield from self._send(chunk, token)), len(chunk))
        except QuotaExceeded:
            if len(chunk) == 1:
                raise
        # The quota refused the whole request, which stored nothing: store the reports one by one (same
        # idempotency ids), as many as it takes, so that what a call stores is always its first reports.
        acks: list[ReportAck] = []
        for one in chunk:
            try:
                acks.extend(_acks((yield from self._send([one], token)), 1))
            except QuotaExceeded as exc:
                exc.acks = tuple(acks)
                raise
        return acks  # room for all of them after all (a new window began)

    def _send(self, chunk: Sequence[shuffler_pb2.ClientReport], token: str | None) -> _Steps[Any]:
        """One Submit of ``chunk`` to ``token``'s replica, following the sharded shuffler's refusals (its reply)."""
        yield from self._check_curator_key({r.payload.key_id for r in chunk if r.payload.key_id}, token)
        metadata = _bearer(token) if token else self.metadata
        token = token or self.token
        request = shuffler_pb2.SubmitRequest(reports=list(chunk))
        try:
            address = yield from self._address_for(token, metadata)
            return (yield from self._call("Submit", request, self._routed(metadata), address))
        except LacClientError as exc:
            shard, refusal = _named_shard(exc), exc
            if shard is None and _refused_for_its_list(exc):  # routed by an outdated list: ask the bootstrap again
                self._forget_routes()
                address = yield from self._address_for(token, metadata)
                return (yield from self._call("Submit", request, self._routed(metadata), address))
            if shard is None:
                raise
        # A replica that does not serve this client named the one that does (nothing was stored): ask that
        # replica for the assignment and retry there once, with the same idempotency ids.
        address = yield from self._follow(token, metadata, shard, refusal)
        try:
            return (yield from self._call("Submit", request, self._routed(metadata), address))
        except LacClientError as exc:
            again = _named_shard(exc)
            if again is None:
                raise
            raise _replicas_disagree(f"{shard} said it serves this client, then sent it to {again}", exc) from None

    def _check_curator_key(self, key_ids: Iterable[str], token: str | None) -> _Steps[None]:
        wanted = frozenset(key_ids)
        known = self._curator_key_ids
        if not wanted or (known is not None and (not known or wanted <= known)):
            return
        metadata = _bearer(token) if token else self.metadata
        try:
            reply = yield from self._call("GetDeployment", reports_pb2.DeploymentRequest(), metadata, rounds=1)
        except RetryableError as exc:
            if exc.status_code in RETRYABLE:  # the shuffler has not heard from the curator yet: the curator checks
                return
            raise
        known = self._curator_key_ids = frozenset(reply.key_ids)
        with contextlib.suppress(InvalidArgument):  # not a deployment this SDK reads: the curator checks
            self._published = deployment_from_proto(reply)
        if known and not wanted <= known:
            raise DeploymentMismatch(
                f"the curator cannot open reports sealed to key id {', '.join(sorted(wanted - known))}: it holds "
                f"key id {', '.join(reply.key_ids)} (its published deployment). This client was given another "
                f"curator's public key, or an outdated one: get the current curator.pub from the curator's "
                f"operator (a key rotated in the last 5 minutes may not be relayed by the shuffler yet). Nothing "
                f"was sent"
            )

    def _replica(self, token: str | None) -> _Steps[str]:
        metadata = _bearer(token) if token else self.metadata
        address = yield from self._address_for(token or self.token, metadata)
        return address or self._in_turn()[0]

    def _address_for(self, token: str | None, metadata: Metadata) -> _Steps[str]:
        """The address of ``token``'s replica (ANY: any address given), asking a bootstrap with ``GetShards``
        the first time."""
        with self._lock:
            address = self._replica_of.get(token)
            if address is not None:
                self._replica_of.move_to_end(token)
            elif self._unsharded:
                return ANY
        if address is None:
            address = yield from self._assignment(ANY, metadata, bootstrap=True)
            shards, own, _ = self._bootstrap_list
            yield from self._check_lists([a for a in shards if a != own], metadata)
            self._remember(token, address)
        return address

    def _check_lists(self, addresses: Iterable[str], metadata: Metadata) -> _Steps[None]:
        """``_lists_differ`` unless each replica at ``addresses`` reports the bootstrap's shard-list digest
        (each asked once; one that does not answer within ``LIST_CHECK_SECONDS`` is asked next time)."""
        bootstrap = self._digest_of.get(ANY, "")
        if not bootstrap:
            return
        for address in addresses:
            if address not in self._digest_of:
                try:
                    reply = yield _Rpc(
                        address, "GetShards", shuffler_pb2.GetShardsRequest(), metadata, quick=LIST_CHECK_SECONDS
                    )
                except grpc.RpcError:  # not reachable now: it cannot store this client's reports either
                    continue
                self._digest_of[address] = reply.shards_digest
            if self._digest_of[address] != bootstrap:
                raise _lists_differ(self._bootstrap_list[2], bootstrap, address, self._digest_of[address])

    def _routed(self, metadata: Metadata) -> Metadata:
        """``metadata`` plus the bootstrap's shard-list digest (when sharded), which the replica checks."""
        digest = self._digest_of.get(ANY, "")
        return (*metadata, (SHARDS_DIGEST_KEY, digest)) if digest else metadata

    def _forget_routes(self) -> None:
        """Forget every replica and list learnt: the next submission asks the bootstrap again."""
        with self._lock:
            self._replica_of.clear()
            self._digest_of.clear()
            self._unsharded = False

    def _assignment(self, address: str, metadata: Metadata, bootstrap: bool = False) -> _Steps[str]:
        """Where the replica at ``address`` (ANY: the first address given to answer) says the caller of
        ``metadata`` submits: its assigned replica, the replica that answered when it serves the caller, or
        ``address`` when the shuffler is not sharded (or the caller anonymous)."""
        reply: shuffler_pb2.ShardAssignment
        try:
            at, reply = yield from self._call_at("GetShards", shuffler_pb2.GetShardsRequest(), metadata, address)
        except LacClientError as exc:
            if exc.status_code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            at, reply = address, shuffler_pb2.ShardAssignment()  # a shuffler from before sharding: not sharded
        self._digest_of[address] = reply.shards_digest
        if reply.store_id:
            self._store_of.setdefault(at, reply.store_id)
        if bootstrap:
            self._bootstrap_list = (tuple(reply.shards), reply.shard_name, at)
        if not reply.shards and bootstrap:
            with self._lock:
                self._unsharded = True
        if not reply.assigned_shard:
            return address
        return at if reply.assigned_shard == reply.shard_name else reply.assigned_shard

    def _follow(self, token: str | None, metadata: Metadata, shard: str, refusal: LacClientError) -> _Steps[str]:
        """After ``refusal`` naming ``shard``: re-fetch the assignment from that replica and route there."""
        with self._lock:
            self._unsharded = False  # the bootstrap may have been sharded since it said otherwise
            self._replica_of.pop(token, None)
        address = yield from self._assignment(shard, metadata)
        if address != shard:
            raise _replicas_disagree(f"a replica sent this client to {shard}, which sends it to {address}", refusal)
        yield from self._check_lists([shard], metadata)
        self._remember(token, shard)
        return shard

    def _remember(self, token: str | None, address: str) -> None:
        with self._lock:
            self._replica_of[token] = address
            self._replica_of.move_to_end(token)
            while len(self._replica_of) > MAX_ROUTES:
                self._replica_of.popitem(last=False)


# ---------------------------------------------------------------------------------------- blocking client


class ShufflerClient(_Submitter):
    """Submits reports to a shuffler over gRPC, many per call, retrying transient failures.

    Production use needs ``curator_key`` (reports are sealed to it) and ``tls`` (the CA
    that signed the shuffler's certificate, optionally a client certificate), plus a
    ``token`` unless the client certificate identifies the client. ``insecure=True``
    allows plaintext payloads and channels for local demos only. A call gives up at once when a
    connection attempt fails (refused, no route, unknown name) and after ``connect_timeout`` seconds
    when none is answered (``RetryableError`` naming the address and why), and each call may take
    ``timeout`` seconds. ``ShufflerClient.connect`` builds the same
    from file paths. ``target`` is the shuffler's address, or a list of its replicas' addresses: a call that
    one of them cannot take (down, draining, failing) goes to the next at once, as the module says. With a
    sharded shuffler they are bootstraps: each token's reports go to its own replica (``replica``), found and
    followed as the module says.
    For asyncio code, ``lac.client.AsyncShufflerClient`` does the same with the same arguments.
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
        self._given = {address: self._open(address) for address in self.targets}  # never evicted

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
    ) -> ShufflerClient:
        """A client of the shuffler at ``address`` ("host:port", or a list of its replicas' addresses) from
        files: ``curator_key`` (the curator's ``curator.pub``, or a loaded ``CuratorPublicKey``), ``ca`` (the CA
        that signed the shuffler's certificate), optionally ``cert``/``key`` for mutual TLS, and the bearer
        ``token`` (default: ``$LAC_CLIENT_TOKEN``). ``options`` go to the constructor
        (``batch_size``, ``attempts``, ``timeout``, ``connect_timeout``)."""
        public, channel_tls, token = cls._from_files(
            curator_key, ca, token, cert, key, insecure, f"{cls.__name__}.connect"
        )
        return cls(address, public, channel_tls, token=token, insecure=insecure, **options)

    def close(self) -> None:
        """Close the channels to the addresses given and to every replica."""
        with self._lock:
            replicas, self._replicas = list(self._replicas.values()), OrderedDict()
            given, self._given = list(self._given.values()), {}
        for channel, _ in replicas + given:
            _quiesce(channel)
            channel.close()

    def __enter__(self) -> ShufflerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, steps: _Steps[_T]) -> _T:
        return _steps_of(steps, self._perform)

    def _perform(self, effect: _Effect) -> Any:
        if isinstance(effect, _Sleep):
            time.sleep(effect.seconds)
            return None
        if isinstance(effect, _Compute):
            return effect.work()
        channel, stub = self._at(effect.address)
        if effect.quick is not None:
            return getattr(stub, effect.method)(effect.request, metadata=effect.metadata, timeout=effect.quick)
        return self._attempt(effect, channel, stub)

    def _open(self, address: str) -> tuple[grpc.Channel, shuffler_pb2_grpc.ShufflerStub]:
        channel = tls.channel(address, self.tls_config, CHANNEL_OPTIONS)
        return channel, shuffler_pb2_grpc.ShufflerStub(channel)

    def _at(self, address: str) -> tuple[grpc.Channel, shuffler_pb2_grpc.ShufflerStub]:
        """The channel and stub to ``address`` (its own for an address given)."""
        if address in self._given:
            return self._given[address]
        entry, evicted = self._replica_entry(address, self._open)
        if evicted is not None:
            evicted[0].close()
        return entry

    def _attempt(self, rpc: _Rpc, channel: grpc.Channel, stub: shuffler_pb2_grpc.ShufflerStub) -> Any:
        """One call: once the channel is connected (``_connect``), sent fail-fast. A call that loses its
        connection before it is sent (a replica that went away, or drains and refuses new streams) then fails
        UNAVAILABLE at once, and one that was sent finishes on its connection while the replica drains; waiting
        for a connection (``wait_for_ready``) would hold the first until its deadline."""
        self._connect(rpc.address, channel, f"Shuffler.{rpc.method}")
        return getattr(stub, rpc.method)(rpc.request, timeout=self.timeout, wait_for_ready=False, metadata=rpc.metadata)

    def _connect(self, address: str, channel: grpc.Channel, what: str) -> None:
        """Wait for ``channel`` to be connected until ``_Connecting`` gives up: then ``RetryableError``
        (UNAVAILABLE) says the address and why (``what`` failed)."""
        seen: queue.SimpleQueue[grpc.ChannelConnectivity] = queue.SimpleQueue()
        watch = seen.put
        connecting = _Connecting(self.connect_timeout, address in self._failing)
        channel.subscribe(watch, try_to_connect=True)
        try:
            while True:
                state: grpc.ChannelConnectivity | None
                try:
                    state = seen.get(timeout=connecting.wait())
                except queue.Empty:  # time has passed: judge the same state again (None: none seen yet)
                    state = connecting.state
                if state == grpc.ChannelConnectivity.READY:
                    break
                if state is not None:
                    connecting.see(state)
                verdict = connecting.verdict()
                if verdict is not None:
                    why = _why(channel, verdict)
                    if why is None:  # connected since the attempt failed
                        break
                    self._failing.add(address)
                    raise _not_reached(address, self.connect_timeout if verdict == "timeout" else None, what, why)
            self._failing.discard(address)
        finally:
            channel.unsubscribe(watch)

    def deployment(self) -> Deployment:
        """The curator's published local-privacy configuration, relayed by the shuffler."""
        return self._run(self._deployment())

    def localizer(self, preset: str | Preset | None = DEFAULT_PRESET, **options: Any) -> Localizer:
        """A Localizer for the curator's current deployment: ``Localizer.for_deployment(self.deployment(),
        preset, **options)`` (ε = the smaller of the deployment's and the preset's)."""
        from lac.client.localizer import Localizer

        return Localizer.for_deployment(self.deployment(), preset, **options)

    def submit(
        self, reports: Iterable[PrivatizedReport] | PrivatizedReport, token: str | None = None
    ) -> list[ReportAck]:
        """Submit ``reports`` (or one report), ``batch_size`` per call; returns one ``ReportAck`` per report,
        in order (status ``AckStatus.STORED``, or ``DUPLICATE`` for one a retried call had stored already).

        When this client's quota for the window runs out, the reports before it are stored and
        ``QuotaExceeded`` is raised with their acks (``acks``) and when to retry (``retry_after``).
        ``token`` overrides this client's token for this call (e.g. a simulation playing many clients).
        A report made at an ε per word the curator's deployment does not take (another than its exact ε, or
        more than its largest) raises ``DeploymentMismatch`` before anything is sent (checked once the
        deployment was asked for the curator key's check).
        """
        return self._run(self._submit(reports, token))

    def submit_prepared(self, chunk: Sequence[shuffler_pb2.ClientReport], token: str | None = None) -> list[ReportAck]:
        """Submit already sealed reports as one request (a retry reuses their idempotency ids, so it stores
        nothing twice); acks and the quota as ``submit``."""
        return self._run(self._submit_prepared(chunk, token))

    def check_curator_key(self, key_ids: Iterable[str], token: str | None = None) -> None:
        """``DeploymentMismatch`` unless the curator can open reports sealed to ``key_ids``: its published
        deployment lists the ids of the keys it holds (asked once, and again after a mismatch in case it
        rotated its keys since). Not checked while the shuffler cannot relay the deployment yet, nor against
        a curator too old to publish its key ids."""
        self._run(self._check_curator_key(key_ids, token))

    def replica(self, token: str | None = None) -> str:
        """The address this client (or ``token``'s client) submits to: its replica when the shuffler is
        sharded (asked of a bootstrap address once, then remembered), else the address given that it tries
        first (the last that answered)."""
        return self._run(self._replica(token))
