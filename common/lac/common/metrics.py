"""Prometheus metrics of the LAC services: one registry per service, RPC latency, the HTTP endpoint.

Imported only by the services: ``prometheus_client`` comes with the ``lac-common[server]`` extra they depend on.

The metrics are for the OPERATOR, like ``GetStatus``: some are exact counts derived from the data
(reports accepted, quarantined, by reason), never noised, so they must not reach analysts. The
endpoint is plaintext and unauthenticated and listens on 127.0.0.1 unless told otherwise
(``metrics_host``; an address beyond loopback is logged as a loud warning at start); give it only
to the operator's monitoring.

Each service has its own ``CollectorRegistry`` (not prometheus_client's global one), so several
services in one process (tests) do not clash. Numbers the service keeps in its store are read at
scrape time (``ScrapeTime``), so they survive restarts and agree with ``GetStatus``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, Histogram, Info, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

__all__ = ["RPC_BUCKETS", "new_registry", "certificate_expiry", "RpcLatency", "ScrapeTime", "MetricsEndpoint"]

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


def new_registry(service: str) -> CollectorRegistry:
    """A registry of one service (``"shuffler"``, ``"curator"``), with the process metrics (``process_*``,
    ``python_info``) and ``lac_build_info{service, version} 1``, ``version`` being the installed version of
    the service's distribution (``lac-<service>``)."""
    from lac.common.version import version

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    Info("lac_build", "The LAC service and its distribution's version.", registry=registry).info(
        {"service": service, "version": version(f"lac-{service}")}
    )
    return registry


def certificate_expiry(registry: CollectorRegistry, certificates: Mapping[str, str]) -> None:
    """``lac_tls_certificate_expiry_timestamp_seconds{certificate}``: when each TLS certificate the service loads at
    start expires (its notAfter, Unix time), for each of ``certificates`` (label -> PEM file; unset ones are left
    out, and so is a file that cannot be read: the service then fails to start, saying why)."""
    from lac.common.tls import expires

    gauge = Gauge(
        "lac_tls_certificate_expiry_timestamp_seconds",
        "When each TLS certificate this service loaded at start expires (notAfter, Unix time): server = the one it "
        "presents to callers, client = the one it presents to the curator, *_ca = the CAs it trusts.",
        ("certificate",),
        registry=registry,
    )
    for name, path in certificates.items():
        if path:
            try:
                gauge.labels(name).set(expires(Path(path)))
            except (OSError, ValueError) as exc:
                log.warning("metrics: no expiry for the %s certificate %s (%s)", name, path, exc)


class RpcLatency:
    """``<prefix>_rpc_seconds{method, code}``: the ``observe`` hook of ``lac.common.rpc.service_handler``."""

    def __init__(self, prefix: str, registry: CollectorRegistry):
        self.histogram = Histogram(
            f"{prefix}_rpc_seconds",
            "Time to answer an RPC, by method and gRPC status code.",
            ("method", "code"),
            buckets=RPC_BUCKETS,
            registry=registry,
        )

    def __call__(self, method: str, code: str, seconds: float) -> None:
        self.histogram.labels(method, code).observe(seconds)


class ScrapeTime(Collector):
    """Metric families computed anew before each scrape by ``compute`` (async: it may read the store)."""

    def __init__(self, compute: Callable[[], Awaitable[Iterable[Metric]]]):
        self.compute = compute
        self._families: list[Metric] = []

    async def refresh(self) -> None:
        self._families = list(await self.compute())

    def collect(self) -> Iterable[Metric]:
        return list(self._families)


class MetricsEndpoint:
    """``GET /metrics`` of ``registry`` over HTTP on the service's event loop (``ScrapeTime`` collectors
    in ``refresh`` are brought up to date first). Text format 0.0.4, or OpenMetrics if the scraper asks."""

    def __init__(self, registry: CollectorRegistry, refresh: Iterable[ScrapeTime] = ()):
        self.registry = registry
        self.refresh = list(refresh)
        self.port: int | None = None
        self._server: asyncio.Server | None = None

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of one scrape."""
        for collector in self.refresh:
            await collector.refresh()
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = request.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            accept = next(
                (line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("accept:")), ""
            )
            if len(parts) == 3 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                body, ctype = await self.render(accept)
                status = "200 OK"
            else:
                body, status, ctype = b"not found; try /metrics\n", "404 Not Found", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except Exception:
            log.exception("metrics scrape failed")
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        finally:
            writer.close()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the bound port."""
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", host, self.port)
        ips = [ipaddress.ip_address(s.getsockname()[0].split("%")[0]) for s in self._server.sockets]
        if outside := sorted({str(ip) for ip in ips if not ip.is_loopback}):
            log.warning(
                "METRICS EXPOSED BEYOND LOOPBACK: http://%s:%d/metrics listens on %s; it is plaintext and "
                "unauthenticated and serves exact, un-noised counts derived from the data to anyone who can "
                "reach it. Use --metrics-host 127.0.0.1, or an address on a network only the operator's "
                "monitoring joins",
                host,
                self.port,
                "every interface" if any(ip.is_unspecified for ip in ips) else ", ".join(outside),
            )
        return self.port

    def start_soon(self, host: str, port: int) -> asyncio.Task[int]:
        """``start`` in a task of the running loop (its result: the port). A failure to listen is logged
        and the service keeps serving without metrics."""

        def report(task: asyncio.Task[int]) -> None:
            if not task.cancelled() and task.exception() is not None:
                log.error("metrics endpoint not started on %s:%d: %s", host, port, task.exception())

        task = asyncio.get_running_loop().create_task(self.start(host, port))
        task.add_done_callback(report)
        return task

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
