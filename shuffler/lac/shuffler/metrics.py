"""Prometheus text-format metrics over a tiny asyncio HTTP server (no extra dependency)."""

from __future__ import annotations

import asyncio

from lac.shuffler.service import LATENCY_BUCKETS, StorageFailed


def _line(name: str, value, labels: str = "") -> str:
    return f"{name}{{{labels}}} {value}" if labels else f"{name} {value}"


async def render(shuffler) -> str:
    """The shuffler's metrics in Prometheus text exposition format 0.0.4."""
    try:
        c = await shuffler.counters()
    except StorageFailed:  # the storage metrics below say why
        c = {}
    out = []

    def metric(name, kind, help_, samples):
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_line(name, v, lab) for lab, v in samples)

    metric("lac_shuffler_buffered_reports", "gauge", "Reports waiting for a batch.", [("", shuffler.buffered())])
    metric("lac_shuffler_log_bytes", "gauge", "Bytes used by the report log.", [("", shuffler.used_bytes())])
    metric("lac_shuffler_max_log_bytes", "gauge", "Disk quota of the report log.",
           [("", shuffler.config.max_log_bytes)])
    metric("lac_shuffler_window", "gauge", "Current accounting window.", [("", shuffler.window())])
    metric("lac_shuffler_reports_accepted_total", "counter", "Reports stored.", [("", c.get("accepted", 0))])
    metric("lac_shuffler_reports_duplicate_total", "counter", "Reports already stored under their idempotency id.",
           [("", c.get("duplicates", 0))])
    metric("lac_shuffler_rejects_total", "counter", "Rejected reports by reason.",
           [(f'reason="{k.split(":", 1)[1]}"', v) for k, v in sorted(c.items()) if k.startswith("reject:")])
    metric("lac_shuffler_dropped_total", "counter", "Reports dropped at release by reason.",
           [('reason="subsampled"', c.get("dropped_subsampled", 0)),
            ('reason="crowd_threshold"', c.get("dropped_crowd_threshold", 0))])
    metric("lac_shuffler_batches_released_total", "counter", "Batches released.", [("", c.get("batches_released", 0))])
    metric("lac_shuffler_batches_forwarded_total", "counter", "Batches acknowledged by the curator.",
           [("", c.get("batches_forwarded", 0))])
    metric("lac_shuffler_reports_forwarded_total", "counter", "Reports acknowledged by the curator.",
           [("", c.get("reports_forwarded", 0))])
    metric("lac_shuffler_forward_failures_total", "counter", "Failed delivery attempts to the curator.",
           [("", shuffler.forward_failures)])
    metric("lac_shuffler_storage_ok", "gauge", "1 while the report log is writable (health SERVING), 0 after a "
           "storage failure until a test write succeeds.", [("", 0 if shuffler.storage_error else 1)])
    metric("lac_shuffler_storage_failures_total", "counter", "Failed storage operations (writes, reads, test writes) "
           "by reason: SQLITE_FULL, SQLITE_IOERR_*, LOW_DISK_SPACE, STALLED, ...",
           [(f'reason="{k}"', v) for k, v in sorted(shuffler.storage_failures.items())])
    if shuffler.disk_free_bytes is not None:
        metric("lac_shuffler_disk_free_bytes", "gauge", "Space the report log can still grow into.",
               [("", shuffler.disk_free_bytes)])
    metric("lac_shuffler_pending_bytes", "gauge", "Payload bytes received and waiting for their durable commit.",
           [("", shuffler.pending_bytes)])
    out.append("# HELP lac_shuffler_ingest_seconds Submit latency from arrival to durable commit.")
    out.append("# TYPE lac_shuffler_ingest_seconds histogram")
    cum = 0
    for le, n in zip(LATENCY_BUCKETS, shuffler.latency_counts):
        cum += n
        out.append(_line("lac_shuffler_ingest_seconds_bucket", cum, f'le="{le}"'))
    cum += shuffler.latency_counts[-1]
    out.append(_line("lac_shuffler_ingest_seconds_bucket", cum, 'le="+Inf"'))
    out.append(_line("lac_shuffler_ingest_seconds_sum", f"{shuffler.latency_sum:.6f}"))
    out.append(_line("lac_shuffler_ingest_seconds_count", cum))
    return "\n".join(out) + "\n"


async def serve_metrics(shuffler, host: str, port: int):
    """Serve GET /metrics on ``host:port``; returns (asyncio server, bound port)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            if request.startswith(b"GET ") and path.split(b"?")[0] == b"/metrics":
                body, status = (await render(shuffler)).encode(), b"200 OK"
                ctype = b"text/plain; version=0.0.4; charset=utf-8"
            else:
                body, status, ctype = b"not found; try /metrics\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    return server, server.sockets[0].getsockname()[1]
