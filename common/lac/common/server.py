"""What every LAC gRPC server shares: health checking, reflection, binding, limits, shutdown.

Imported only by the services (grpcio-health-checking and grpcio-reflection are their
dependencies, not the client's).

Limits enforced by gRPC itself (before a request is parsed): ``max_message_bytes`` (a larger
request is refused with RESOURCE_EXHAUSTED, without ``retry-after-seconds``) and
``max_concurrent_streams`` per HTTP/2 connection (calls beyond it wait in the client until a
stream of that connection ends, or are refused with UNAVAILABLE: HTTP/2 REFUSED_STREAM), and, if set,
``max_connections`` open connections (gRPC closes a connection beyond it as soon as it is accepted, so
its client fails at once with UNAVAILABLE instead of a handshake that times out; the open-file limit
is raised to make room for them when it can be).

One server per port: gRPC's default SO_REUSEPORT is turned off (with it a second server on the
same port would start and the kernel would split the connections between two servers holding
different state), and a port already in use is ``PortUnavailable``, one line naming it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lac.common import tracing
from lac.common.tls import ServerTls

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class PortUnavailable(OSError):
    """The server's address cannot be listened on (in use by another process, or not this machine's)."""


def new_server(
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_concurrent_streams: int | None = None,
    max_connections: int | None = None,
    trace_callers: str = "child",
) -> grpc.aio.Server:
    """An asyncio gRPC server refusing messages over ``max_message_bytes`` (RESOURCE_EXHAUSTED) and,
    if set, serving at most ``max_concurrent_streams`` calls at once per client connection and at most
    ``max_connections`` connections; its ``lac.v1`` calls are traced if ``lac.common.tracing`` is on, each
    span placed relative to the caller's as ``trace_callers`` says (``lac.common.tracing.CALLERS``)."""
    options = [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if max_concurrent_streams is not None:
        options.append(("grpc.max_concurrent_streams", max_concurrent_streams))
    if max_connections is not None:
        options.append(("grpc.max_allowed_incoming_connections", max_connections))
        _make_room_for(max_connections)
    return grpc.aio.server(options=options, interceptors=tracing.server_interceptors(trace_callers))


FDS_BESIDES_CONNECTIONS = 256  # the server's own files: databases, segments, logs, its outgoing channels


def _make_room_for(connections: int) -> None:
    """Raise the soft open-file limit so ``connections`` sockets fit beside the server's own files (up to
    the hard limit); if they cannot, say so once: the limit would then be the file descriptors, not the
    setting."""
    need = connections + FDS_BESIDES_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "the open-file limit (%d) leaves room for fewer than max_connections=%d connections: raise it "
            "(ulimit -n %d) or lower max_connections",
            soft,
            connections,
            need,
        )


class Health:
    """The gRPC health-checking state of one server: its services and the server as a whole ("").

    ``set_serving(False)`` makes ``Check`` answer NOT_SERVING for all of them (load balancers and
    ``lac health`` then stop sending traffic); ``set_serving(True)`` restores SERVING.
    """

    def __init__(self, service_names: Iterable[str]):
        self.servicer = health.HealthServicer()
        self.names = [*service_names, ""]
        self.serving = True
        self.set_serving(True)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.serving = serving
        for name in self.names:
            self.servicer.set(name, status)


def finish_server(
    server: grpc.aio.Server,
    service_names: Iterable[str],
    host: str,
    port: int,
    tls: ServerTls | None = None,
    health_state: Health | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Add health + reflection for ``service_names`` and bind ``host:port`` (0 = ephemeral).

    With ``tls`` the port speaks TLS (mTLS if it names a client CA); without, plaintext.
    ``health_state`` lets the service change its health later (default: always SERVING).
    """
    names = list(service_names)
    health_state = health_state if health_state is not None else Health(names)
    health_pb2_grpc.add_HealthServicer_to_server(health_state.servicer, server)
    reflection.enable_server_reflection(names + [reflection.SERVICE_NAME, health.SERVICE_NAME], server)
    address = f"{host}:{port}"
    if port:
        _check_free(host, port)
    try:
        bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError:  # gRPC's "Failed to bind": the port was taken since the check, or the host is not ours
        bound = 0
    if bound == 0:
        raise PortUnavailable(f"cannot listen on {address}: in use, or not an address of this machine")
    return server, bound


def _check_free(host: str, port: int) -> None:
    """``PortUnavailable`` if another socket listens on ``port`` at an address ``host`` resolves to:
    said here in one line, before gRPC's own bind logs its failure in several."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC resolves and refuses it itself
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT does not count
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortUnavailable(
                        f"port {port} on {host} is already in use (another server listens there?): "
                        f"one server per port; stop that one or choose another --port"
                    ) from None


async def run_until_signalled(
    server: grpc.aio.Server,
    port: int,
    port_file: Path | None,
    name: str,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    grace_seconds: float = 5.0,
) -> None:
    """Start ``server``, write the bound port to ``port_file``, stop gracefully on SIGTERM/SIGINT.

    On a signal the server stops taking new calls, lets running ones finish for
    ``grace_seconds``, then ``on_stop`` closes the service's own state.
    """
    await server.start()
    if port_file is not None:
        tmp = port_file.with_suffix(port_file.suffix + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(port_file)
    log.info("%s listening on port %d", name, port, extra={"service": name, "port": port})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s stopping (grace %.1fs)", name, grace_seconds, extra={"service": name})
    await server.stop(grace_seconds)
    if on_stop is not None:
        await on_stop()
    tracing.shutdown()  # exports the spans still buffered
    log.info("%s stopped", name, extra={"service": name})
