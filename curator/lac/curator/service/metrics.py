"""The curator's Prometheus metrics (``lac.common.metrics``).

For the OPERATOR only, like ``GetStatus``: the report and reject counts are exact, un-noised numbers
derived from the data, which no analyst may see. Everything but the RPC latencies is read from the
store at scrape time, so the numbers survive restarts and agree with ``GetStatus`` and ``GetBudget``.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lac.common.metrics import MetricsEndpoint, RpcLatency, ScrapeTime, certificate_expiry, new_registry
from lac.curator.service.handlers import status

if TYPE_CHECKING:
    from lac.curator.service.state import CuratorState

log = logging.getLogger(__name__)

BUDGET_WINDOWS = 30  # the budget gauges cover this many most recent windows (with reports or spending)


class CuratorMetrics:
    """The registry of one curator (its ``CuratorState``): RPC latencies it observes, the rest read from its store
    per scrape."""

    def __init__(self, curator: CuratorState):
        self.curator = curator
        self.registry = new_registry("curator")
        self.rpc = RpcLatency("lac_curator", self.registry)
        certificate_expiry(
            self.registry, {"server": curator.config.tls_cert, "client_ca": curator.config.tls_client_ca}
        )
        self._scraped = ScrapeTime(self._collect)
        self.registry.register(self._scraped)
        self.endpoint = MetricsEndpoint(self.registry, [self._scraped])
        self._storage_failing = False

    async def _collect(self):
        c = self.curator
        budget = c.budget
        out = [
            GaugeMetricFamily(
                "lac_curator_window", "Current accounting window.", value=c.deployment.window(time.time())
            ),
            GaugeMetricFamily(
                "lac_curator_budget_epsilon", "ε budget of each accounting window.", value=budget.epsilon
            ),
            GaugeMetricFamily("lac_curator_budget_delta", "δ budget of each accounting window.", value=budget.delta),
            GaugeMetricFamily(
                "lac_curator_channel_missing",
                "1 while the local channel the configuration expects (clean_estimate) could not be had: releases "
                "then describe the perturbed reports, not the users' clean text (their statements say so first).",
                value=1 if c.channel_missing else 0,
            ),
        ]
        ingest = c.ingest
        out += [
            GaugeMetricFamily(
                "lac_curator_ingest_pool_ok",
                "1 while the ingest workers run (or batches are opened in process), 0 "
                "while they are started again after one died or stalled (health NOT_SERVING).",
                value=int(ingest.ok),
            ),
            CounterMetricFamily(
                "lac_curator_ingest_worker_deaths_total",
                "Times an ingest worker process (or its forkserver) ended on its own, e.g. killed by "
                "the OOM killer: the batches in the pool answered UNAVAILABLE and the workers were started again.",
                value=ingest.deaths,
            ),
            CounterMetricFamily(
                "lac_curator_ingest_stalls_total",
                "Times no ingest chunk finished within ingest_stall_seconds while batches waited: they "
                "answered UNAVAILABLE and the workers were killed and started again.",
                value=ingest.stalls,
            ),
        ]
        if c.config.clean_estimate:
            ch = c.channel_progress
            left = ch.seconds_left()
            out += [
                GaugeMetricFamily(
                    "lac_curator_channel_progress",
                    "Share of the local channel's Monte-Carlo sampling done, 0..1 (1 once read from the cache).",
                    value=ch.fraction,
                ),
                GaugeMetricFamily(
                    "lac_curator_channel_ready",
                    "1 once the local channel is ready for releases (they answer UNAVAILABLE before), else 0.",
                    value=int(ch.ready),
                ),
                GaugeMetricFamily(
                    "lac_curator_channel_seconds_left",
                    "Estimated seconds left in the local channel's sampling (0 when not sampling).",
                    value=left or 0.0,
                ),
            ]
        try:
            free = shutil.disk_usage(c.config.files_dir).free
            out.append(
                GaugeMetricFamily(
                    "lac_curator_disk_free_bytes",
                    "Free space on the filesystem of the segments and releases (shared_dir, by default state_dir).",
                    value=free,
                )
            )
        except OSError:
            pass
        try:
            now = await status.status(c)
            by_mechanism = await status.releases_by_mechanism(c)
        except Exception as exc:
            if not self._storage_failing:
                log.error("metrics: the store could not be read (%s: %s)", type(exc).__name__, exc)
            self._storage_failing = True
            out.append(
                GaugeMetricFamily(
                    "lac_curator_storage_ok",
                    "1 while the store can be read and written, 0 "
                    "while writes fail (health NOT_SERVING) or reading failed at this "
                    "scrape.",
                    value=0,
                )
            )
            return out
        self._storage_failing = False
        guard = c.storage
        out.append(
            GaugeMetricFamily(
                "lac_curator_storage_ok",
                "1 while the store can be read and written, 0 "
                "while writes fail (health NOT_SERVING) or reading failed at this scrape.",
                value=int(guard.ok),
            )
        )
        failures = CounterMetricFamily(
            "lac_curator_storage_failures_total",
            "Failed storage operations by reason (disk full, I/O error, ...).",
            labels=["reason"],
        )
        for reason, n in sorted(guard.failures.items()):
            failures.add_metric([reason], n)
        out.append(failures)
        out.append(
            CounterMetricFamily(
                "lac_curator_batches_ingested_total",
                "Batches stored (a redelivered batch counts once).",
                value=now.batches,
            )
        )
        out.append(
            CounterMetricFamily(
                "lac_curator_reports_ingested_total", "Reports stored (exact; operator only).", value=now.reports
            )
        )
        rejected = CounterMetricFamily(
            "lac_curator_reports_rejected_total",
            "Reports not stored, by reason: "
            "quarantined (unknown_key, invalid, epsilon_too_large, ...) or dropped "
            "(replayed_report_id).",
            labels=["reason"],
        )
        for reason, n in sorted(now.rejects.items()):
            rejected.add_metric([reason], n)
        out.append(rejected)
        out.append(
            GaugeMetricFamily(
                "lac_curator_quarantine_rows",
                "Quarantined reports kept for diagnosis (the newest quarantine_max_rows).",
                value=now.quarantined,
            )
        )
        releases = CounterMetricFamily(
            "lac_curator_releases_total",
            "Releases stored, by mechanism and whether they are differentially private.",
            labels=["mechanism", "dp"],
        )
        for (mechanism, dp), n in sorted(by_mechanism.items()):
            releases.add_metric([mechanism, "true" if dp else "false"], n)
        out.append(releases)
        families = {
            name: GaugeMetricFamily(f"lac_curator_budget_{name}", text, labels=["window"])
            for name, text in (
                ("epsilon_spent", "ε spent in an accounting window."),
                ("epsilon_remaining", "ε left to spend in an accounting window."),
                ("delta_spent", "δ spent in an accounting window."),
                ("delta_remaining", "δ left to spend in an accounting window."),
            )
        }
        for w in sorted(now.spent)[-BUDGET_WINDOWS:]:
            s = now.spent[w]
            families["epsilon_spent"].add_metric([str(w)], s.epsilon)
            families["epsilon_remaining"].add_metric([str(w)], max(0.0, budget.epsilon - s.epsilon))
            families["delta_spent"].add_metric([str(w)], s.delta)
            families["delta_remaining"].add_metric([str(w)], max(0.0, budget.delta - s.delta))
        out.extend(families.values())
        return out
