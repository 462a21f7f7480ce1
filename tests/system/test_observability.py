"""Metrics and logs for the operator: both services' /metrics over HTTP after real traffic
(Submit -> batch -> IngestBatch -> Release), and JSON log lines that parse."""

from __future__ import annotations

import io
import json
import logging
import os
import time
import urllib.error
import urllib.request

import grpc
import pytest
from lac_testkit import DEPLOYMENT, metrics_port, run_traffic, samples, scrape, wait_until

from lac.common.logs import JsonFormatter, configure
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def pipeline(start_curator, start_shuffler):
    """A curator and a shuffler (min_batch 5) with metrics on 127.0.0.1, both started by the shared fixtures."""
    cur = start_curator(metrics_port=0)
    shf = start_shuffler(cur.address, min_batch=5, metrics_port=0)
    return cur, shf


def test_metrics_follow_submit_batch_ingest_release(pipeline, curator_public_key):
    cur, shf = pipeline
    window = str(DEPLOYMENT.window(time.time()))
    run_traffic(shf.address, cur.address, curator_public_key, good=4, release=False)
    with grpc.insecure_channel(cur.address) as cch:
        curator = curator_pb2_grpc.CuratorStub(cch)
        text, ctype = scrape(metrics_port(shf))
        assert ctype.startswith("text/plain; version=0.0.4")
        s = samples(text)
        assert value(s, "lac_shuffler_reports_accepted_total") == 5
        assert value(s, "lac_shuffler_rejects_total", reason="invalid_argument") == 1
        assert value(s, "lac_shuffler_batches_released_total") == 1
        assert value(s, "lac_shuffler_batches_forwarded_total") == 1
        assert value(s, "lac_shuffler_reports_forwarded_total") == 5
        assert value(s, "lac_shuffler_batches_pending") == 0 and value(s, "lac_shuffler_buffered_reports") == 0
        assert value(s, "lac_shuffler_storage_ok") == 1
        assert value(s, "lac_shuffler_ingest_seconds_count") == 1  # one group commit held the five reports
        assert value(s, "lac_shuffler_forward_seconds_count", code="OK") == 1
        assert value(s, "lac_shuffler_rpc_seconds_count", method="Submit", code="OK") == 1
        assert value(s, "lac_shuffler_rpc_seconds_count", method="Submit", code="INVALID_ARGUMENT") == 1
        assert value(s, "lac_shuffler_rpc_seconds_count", method="GetStatus", code="OK") >= 1
        assert value(s, "process_resident_memory_bytes") > 0 and any(n == "python_info" for n, _ in s)

        s = samples(scrape(metrics_port(cur))[0])
        assert value(s, "lac_curator_batches_ingested_total") == 1
        assert value(s, "lac_curator_reports_ingested_total") == 4
        assert value(s, "lac_curator_reports_rejected_total", reason="epsilon_too_large") == 1
        assert value(s, "lac_curator_quarantine_rows") == 1
        assert value(s, "lac_curator_rpc_seconds_count", method="IngestBatch", code="OK") == 1
        assert value(s, "lac_curator_storage_ok") == 1 and value(s, "lac_curator_disk_free_bytes") > 0
        assert value(s, "lac_curator_budget_epsilon_spent", window=window) == 0
        assert value(s, "lac_curator_budget_epsilon_remaining", window=window) == value(s, "lac_curator_budget_epsilon")
        assert not [k for k in s if k[0] == "lac_curator_releases_total"]

        record = curator.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True), timeout=60)
        with pytest.raises(grpc.RpcError):
            curator.GetRelease(curator_pb2.GetReleaseRequest(release_id="nope"), timeout=5)
        s = samples(scrape(metrics_port(cur))[0])
        assert value(s, "lac_curator_releases_total", mechanism=record.mechanism, dp="true") == 1
        assert value(s, "lac_curator_budget_epsilon_spent", window=window) == pytest.approx(0.5)
        assert value(s, "lac_curator_budget_epsilon_remaining", window=window) == pytest.approx(
            value(s, "lac_curator_budget_epsilon") - 0.5
        )
        assert value(s, "lac_curator_budget_delta_spent", window=window) == pytest.approx(1e-6)
        assert value(s, "lac_curator_rpc_seconds_count", method="Release", code="OK") == 1
        assert value(s, "lac_curator_rpc_seconds_count", method="GetRelease", code="NOT_FOUND") == 1


def test_metrics_endpoint_speaks_openmetrics_and_refuses_other_paths(pipeline):
    cur, _ = pipeline
    port = metrics_port(cur)
    text, ctype = scrape(port, accept="application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and text.rstrip().endswith("# EOF")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    err.value.close()  # the error holds the response and its socket
    assert err.value.code == 404


def test_registries_are_per_service(start_curator):
    """Two curators in one process: each endpoint counts only its own calls."""
    cur, other = start_curator(metrics_port=0), start_curator(metrics_port=0)
    with grpc.insecure_channel(other.address) as ch:
        for _ in range(2):
            curator_pb2_grpc.CuratorStub(ch).GetDeployment(reports_pb2.DeploymentRequest(), timeout=5)
    mine = samples(scrape(metrics_port(cur))[0])
    theirs = samples(scrape(metrics_port(other))[0])
    assert not [k for k in mine if k[0] == "lac_curator_rpc_seconds_count"]
    assert value(theirs, "lac_curator_rpc_seconds_count", method="GetDeployment", code="OK") == 2


def test_json_log_lines_parse():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("lac.test.json")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("batch %s: %d reports", "b1", 5, extra={"batch_id": "b1", "reports": 5, "path": os.curdir})
        try:
            raise ValueError("broken\nacross lines")
        except ValueError:
            log.exception("failed: ε = %g", 0.5)
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # one object per line, newlines in messages and tracebacks escaped
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "batch b1: 5 reports" and first["level"] == "WARNING"
    assert first["logger"] == "lac.test.json" and first["batch_id"] == "b1" and first["reports"] == 5
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert second["message"] == "failed: ε = 0.5" and "ValueError: broken" in second["exception"]
    with pytest.raises(ValueError, match="log format"):
        configure("xml")


@pytest.mark.slow  # a real process: 3-7 s on a busy machine
def test_served_shuffler_logs_json(tmp_path):
    """``lac shuffler serve --log-format json``: every line the real process writes is a JSON object."""
    from lac.suite import procs

    running = procs.start(
        "shuffler",
        [
            "--state-dir",
            str(tmp_path / "state"),
            "--curator",
            "127.0.0.1:1",
            "--insecure",
            "--auth",
            "none",
            "--log-format",
            "json",
            "--metrics-port",
            "0",
        ],
        tmp_path / "proc",
        timeout=60,
    )
    try:
        wait_until(lambda: "metrics on" in running.log_path.read_text())
    finally:
        assert running.stop() == 0
    lines = [json.loads(line) for line in running.log_path.read_text().splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    started = next(line for line in lines if line["message"].startswith("metrics on http://127.0.0.1:"))
    assert started["logger"] == "lac.common.metrics" and started["level"] == "INFO"
    assert any(line["message"] == "shuffler stopped" for line in lines)


def test_both_services_expose_build_info_and_name_their_version(pipeline):
    """``lac_build_info{service, version} 1`` on each service's /metrics, and the version in the published
    deployment: the curator's, and the shuffler's own when it relays it."""
    from importlib.metadata import version

    from lac.common.v1 import shuffler_pb2_grpc

    cur, shf = pipeline
    for server, service in ((cur, "curator"), (shf, "shuffler")):
        s = samples(scrape(metrics_port(server))[0])
        build = {labels for name, labels in s if name == "lac_build_info"}
        assert build == {frozenset({"service": service, "version": version(f"lac-{service}")}.items())}
        assert value(s, "lac_build_info", service=service, version=version(f"lac-{service}")) == 1
    with grpc.insecure_channel(cur.address) as ch:
        d = curator_pb2_grpc.CuratorStub(ch).GetDeployment(reports_pb2.DeploymentRequest(), timeout=5)
    assert d.server_version == f"lac-curator {version('lac-curator')}"
    with grpc.insecure_channel(shf.address) as ch:
        got = []
        wait_until(lambda: got.append(_deployment_or_none(shuffler_pb2_grpc.ShufflerStub(ch))) or got[-1])
        relayed = got[-1]
    assert relayed.server_version == f"lac-shuffler {version('lac-shuffler')}"
    d.server_version = relayed.server_version = ""
    assert relayed == d  # the rest is the curator's deployment, relayed unchanged


def _deployment_or_none(stub):
    try:
        return stub.GetDeployment(reports_pb2.DeploymentRequest(), timeout=5)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:  # not fetched from the curator yet
            raise
        return None


def test_each_certificate_s_expiry_is_a_metric(start_curator, start_shuffler, pki, tmp_path):
    """``lac_tls_certificate_expiry_timestamp_seconds{certificate}``: the notAfter of every certificate a service
    loads (its own, the one it presents to the curator, the CAs it trusts); none for an insecure service."""
    from lac.common import tls

    tls.issue(pki.root, "shuffler-out", ["localhost"], days=30)  # the shuffler's client certificate: sooner
    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, metrics_port=0)
    cert, key = pki.pem("shuffler")
    out_cert, out_key = pki.pem("shuffler-out")
    shf = start_shuffler(
        "127.0.0.1:1",
        insecure=False,
        tls_cert=cert,
        tls_key=key,
        curator_ca=pki.ca,
        curator_cert=out_cert,
        curator_key=out_key,
        metrics_port=0,
    )
    plain = start_shuffler("127.0.0.1:1", metrics_port=0)

    def expiry(server) -> dict[str, float]:
        found = samples(scrape(metrics_port(server))[0])
        return {
            dict(labels)["certificate"]: v
            for (name, labels), v in found.items()
            if name == "lac_tls_certificate_expiry_timestamp_seconds"
        }

    from pathlib import Path

    assert expiry(cur) == {"server": tls.expires(Path(pki.pem("curator")[0])), "client_ca": tls.expires(Path(pki.ca))}
    assert expiry(shf) == {
        "server": tls.expires(Path(cert)),
        "client": tls.expires(Path(out_cert)),
        "curator_ca": tls.expires(Path(pki.ca)),
    }
    assert 29 * 86400 < expiry(shf)["client"] - time.time() < 31 * 86400
    assert expiry(plain) == {}
