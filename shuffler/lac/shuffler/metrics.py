"""The shuffler's Prometheus metrics (``lac.common.metrics``; operator-only: they include exact counts).

Counters kept in the report log (accepted, duplicates, rejects by reason, batches and reports
released and forwarded) are read from it at scrape time, so they survive restarts and agree with
``GetStatus``. Latencies are histograms observed as they happen. Nothing here imports the state:
``ShufflerMetrics`` reads the ``ShufflerState`` it is given.
"""

from __future__ import annotations

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lac.common.errors import Unavailable
from lac.common.metrics import MetricsEndpoint, RpcLatency, ScrapeTime, certificate_expiry, new_registry

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FORWARD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class ShufflerMetrics:
    """The registry of one ``ShufflerState``: latency histograms it observes, the rest read per scrape."""

    def __init__(self, state):
        self.state = state
        self.registry = new_registry("shuffler")
        self.ingest_seconds = Histogram(
            "lac_shuffler_ingest_seconds",
            "Submit latency from arrival to durable commit.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.forward_seconds = Histogram(
            "lac_shuffler_forward_seconds",
            "Delivery attempts of a batch to the curator (IngestBatch), by gRPC status code.",
            ("code",),
            buckets=FORWARD_BUCKETS,
            registry=self.registry,
        )
        self.rpc = RpcLatency("lac_shuffler", self.registry)
        cfg = state.config
        certificate_expiry(
            self.registry,
            {
                "server": cfg.tls_cert,
                "client": cfg.curator_cert or cfg.tls_cert,
                "curator_ca": cfg.curator_ca,
                "client_ca": cfg.tls_client_ca,
            },
        )
        self._scraped = ScrapeTime(self._collect)
        self.registry.register(self._scraped)
        self.endpoint = MetricsEndpoint(self.registry, [self._scraped])

    async def _collect(self):
        s = self.state
        try:
            await s.recount()
            c = await s.counters()
            pending = await s.batches_pending()
            dead = await s.batches_dead_letter()
        except Unavailable:  # a storage failure: the storage metrics below say why
            c, pending, dead = {}, None, None

        def gauge(name, help_, value):
            return GaugeMetricFamily(name, help_, value=value)

        def counter(name, help_, value=None, labels=(), samples=()):
            family = CounterMetricFamily(name, help_, value=value, labels=labels or None)
            for label_values, v in samples:
                family.add_metric(label_values, v)
            return family

        out = [
            gauge("lac_shuffler_buffered_reports", "Reports waiting for a batch.", s.buffered()),
            gauge("lac_shuffler_log_bytes", "Bytes used by the report log.", s.used_bytes()),
            gauge("lac_shuffler_max_log_bytes", "Disk quota of the report log.", s.config.max_log_bytes),
            gauge("lac_shuffler_window", "Current accounting window.", s.window()),
            counter("lac_shuffler_reports_accepted_total", "Reports stored.", c.get("accepted", 0)),
            counter(
                "lac_shuffler_reports_duplicate_total",
                "Reports already stored under their idempotency id.",
                c.get("duplicates", 0),
            ),
            counter(
                "lac_shuffler_rejects_total",
                "Rejected reports by reason.",
                labels=("reason",),
                samples=[((k.split(":", 1)[1],), v) for k, v in sorted(c.items()) if k.startswith("reject:")],
            ),
            counter(
                "lac_shuffler_dropped_total",
                "Reports dropped at release by reason.",
                labels=("reason",),
                samples=[
                    (("subsampled",), c.get("dropped_subsampled", 0)),
                    (("crowd_threshold",), c.get("dropped_crowd_threshold", 0)),
                ],
            ),
            counter("lac_shuffler_batches_released_total", "Batches released.", c.get("batches_released", 0)),
            counter(
                "lac_shuffler_batches_forwarded_total",
                "Batches acknowledged by the curator.",
                c.get("batches_forwarded", 0),
            ),
            counter(
                "lac_shuffler_reports_forwarded_total",
                "Reports acknowledged by the curator.",
                c.get("reports_forwarded", 0),
            ),
            counter(
                "lac_shuffler_forward_failures_total", "Failed delivery attempts to the curator.", s.forward_failures
            ),
            gauge(
                "lac_shuffler_storage_ok",
                "1 while the report log is writable (health SERVING), 0 after a "
                "storage failure until a test write succeeds.",
                int(s.storage.ok),
            ),
            counter(
                "lac_shuffler_storage_failures_total",
                "Failed storage operations (writes, reads, test writes) "
                "by reason: SQLITE_FULL, SQLITE_IOERR_*, LOW_DISK_SPACE, STALLED, ...",
                labels=("reason",),
                samples=[((k,), v) for k, v in sorted(s.storage.failures.items())],
            ),
            gauge(
                "lac_shuffler_release_lease",
                "1 while this replica holds the release lease (it alone releases and forwards batches; replicas over "
                "one PostgreSQL database hold it one at a time, a SQLite shuffler always), else 0.",
                int(s.lease.held),
            ),
            gauge(
                "lac_shuffler_pending_bytes",
                "Payload bytes received and waiting for their durable commit.",
                s.pending_bytes,
            ),
            gauge(
                "lac_shuffler_deployment_mismatch",
                "1 while this shuffler's privacy unit is not the one the curator's deployment publishes (Submit "
                "refused, health NOT_SERVING), else 0.",
                int(bool(s.mismatch)),
            ),
            counter(
                "lac_shuffler_dead_letters_total",
                "Batches the curator refused for good and that were set aside as dead letters (a retried one "
                "refused again counts again).",
                c.get("batches_dead_lettered", 0),
            ),
            counter(
                "lac_shuffler_dead_letter_reports_dropped_total",
                "Reports of dead letters the operator dropped (never delivered).",
                c.get("reports_dropped_dead_letter", 0),
            ),
        ]
        if pending is not None:
            out.append(
                gauge(
                    "lac_shuffler_batches_pending",
                    "Released batches not yet acknowledged by the curator (the delivery backlog; dead letters aside).",
                    pending,
                )
            )
        if dead is not None:
            out.append(
                gauge(
                    "lac_shuffler_batches_dead_letter",
                    "Batches the curator refused for good, set aside until the operator retries or drops them "
                    "(lac shuffler dead-letter).",
                    dead,
                )
            )
        if s.disk_free_bytes is not None:
            out.append(
                gauge("lac_shuffler_disk_free_bytes", "Space the report log can still grow into.", s.disk_free_bytes)
            )
        return out
