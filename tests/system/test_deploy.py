"""docker-compose.yml without a Docker engine: the key-generation script, every service command
and every health check are run locally with the volumes mapped to directories (and compose's
variable substitution applied, the image's environment set), each image installs only its own component,
every bind mount's source is in the repository as cloned and every file a command reads from the image is
made by the Dockerfile, and the `sharded` profile runs two shuffler replicas sharded over the addresses
clients use."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from lac.common import tls
from lac.suite import procs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
IMAGE_ENV = dict(re.findall(r"^ENV (\w+)=(\S+)$", DOCKERFILE, re.M))  # the image's environment
PUBLIC_CORPUS = "/usr/share/lac/public.txt"  # the curator image's public corpus, built by the Dockerfile
SERVERS = ["curator", "shuffler"]
SHARDS = "localhost:50051,localhost:50053"  # what the file's comments tell operators to set
_VARIABLE = re.compile(r"\$\{(\w+)(?::([-+])([^}]*))?\}")


def _interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose's variable substitution in the forms this file uses: ``${VAR}``, ``${VAR:-default}``
    (default when VAR is unset or empty) and ``${VAR:+replacement}`` (replacement when VAR is set and
    not empty, else nothing)."""

    def value(m: re.Match) -> str:
        found = environ.get(m.group(1), "")
        if m.group(2) == "-":
            return found or m.group(3)
        if m.group(2) == "+":
            return m.group(3) if found else ""
        return found

    return _VARIABLE.sub(value, text)


def _mounts(service: str, tmp: Path, public_corpus: Path) -> list[tuple[str, str]]:
    """(container path, local path) for each named volume of ``service`` and the image's public corpus (a small
    stand-in: ``test_the_image_builds_the_public_corpus_lac_data_prepares`` checks the real one), longest first."""
    out = [(PUBLIC_CORPUS, str(public_corpus))]
    for v in COMPOSE["services"][service]["volumes"]:
        source, target = v.split(":")[:2]
        local = tmp / "volumes" / source
        local.mkdir(parents=True, exist_ok=True)
        out.append((target, str(local)))
    return sorted(out, key=lambda m: -len(m[0]))


def _map(text: str, mounts) -> str:
    for target, local in mounts:
        text = text.replace(target, local)
    return text


def _env(tmp: Path, mounts=()) -> dict:
    """This environment with the image's (its ``ENV`` lines: a path on a volume mapped by ``mounts``, else one of
    the image's own directories, under ``tmp/image``) and this venv's ``lac``."""
    image = {}
    for name, value in IMAGE_ENV.items():
        mapped = _map(value, mounts)
        image[name] = mapped if mapped != value else str(tmp / "image" / value.lstrip("/"))
    return {**os.environ, **image, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, request):
    """Run the `keys` service's script locally once: the volumes every service then mounts."""
    tmp = tmp_path_factory.mktemp("compose")
    public = tmp / "public.txt"
    public.write_text("The cat sat on the mat. The dog sat on the log.\n" * 20)
    spec = COMPOSE["services"]["keys"]
    assert spec["entrypoint"] == ["sh", "-c"]
    mounts = _mounts("keys", tmp, public)
    script = _map(spec["command"][0], mounts)
    for _ in range(2):  # idempotent: a second `docker compose up` keeps the keys
        subprocess.run(["sh", "-c", script], check=True, env=_env(tmp, mounts), capture_output=True, timeout=120)
    return tmp, public


def test_keys_go_only_where_they_belong(deployed):
    tmp, _ = deployed
    vol = tmp / "volumes"
    assert (vol / "curator-keys" / "keyring.json").exists() and (vol / "curator-keys" / "curator.pub").exists()
    assert sorted(p.name for p in (vol / "shuffler-tls").iterdir()) == ["ca.pem", "shuffler.key", "shuffler.pem"]
    assert sorted(p.name for p in (vol / "curator-tls").iterdir()) == ["ca.pem", "curator.key", "curator.pem"]
    for shuffler in ("shuffler", "shuffler-b"):
        shuffler_volumes = {v.split(":")[0] for v in COMPOSE["services"][shuffler]["volumes"]}
        assert "curator-keys" not in shuffler_volumes and "ca" not in shuffler_volumes
    assert "ca" not in {v.split(":")[0] for v in COMPOSE["services"]["curator"]["volumes"]}


def _serve_args(service: str, tmp: Path, public: Path, environ: dict[str, str]) -> tuple[str, list[str]]:
    """The component and the ``serve`` flags of ``service``'s command, run locally: volumes mapped, variables
    substituted from ``environ``, bound to 127.0.0.1:0 by procs.start."""
    spec = COMPOSE["services"][service]
    mounts = _mounts(service, tmp, public)
    name, action, *rest = [_map(_interpolate(a, environ), mounts) for a in spec["command"]]
    assert action == "serve"
    args, it = [], iter(rest)
    for flag in it:
        value = next(it)
        if flag in ("--host", "--port", "--metrics-host", "--metrics-port"):
            continue  # procs.start binds 127.0.0.1:0; the metrics host is an alias on compose's metrics network
        if flag == "--curator":
            value = "127.0.0.1:1"  # nothing listening: the shuffler must still start and keep its batches
        args += [flag, value]
    return name, args


def _start_healthy(service: str, tmp: Path, public: Path, environ: dict[str, str]) -> procs.Service:
    """Start ``service`` locally and run its compose health check against it."""
    name, args = _serve_args(service, tmp, public, environ)
    check = COMPOSE["services"][service]["healthcheck"]["test"]
    assert check[0] == "CMD"
    mounts = _mounts(service, tmp, public)
    cmd = [_map(a, mounts) for a in check[1:]]
    flags = dict(zip(cmd[2::2], cmd[3::2]))  # lac health --server ADDRESS --ca .. [--cert .. --key ..]
    probe_tls = tls.client_tls(flags["--ca"], flags.get("--cert", ""), flags.get("--key", ""))
    running = procs.start(name, args, tmp / service, timeout=60, env=_env(tmp, mounts), tls=probe_tls)
    try:
        cmd = [running.address if a.startswith("127.0.0.1:") else a for a in cmd]
        probe = subprocess.run(cmd, env=_env(tmp, mounts), capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        assert "SERVING" in probe.stdout
    except BaseException:
        running.stop()
        raise
    return running


def test_every_variable_is_one_the_test_substitutes():
    assert "$" not in _VARIABLE.sub("", COMPOSE_TEXT)


@pytest.mark.parametrize("service", SERVERS)
def test_compose_service_starts_and_is_healthy(service, deployed):
    tmp, public = deployed
    spec = COMPOSE["services"][service]
    assert spec["build"]["args"]["COMPONENT"] == service
    assert spec["depends_on"]["keys"]["condition"] == "service_completed_successfully"
    assert "profiles" not in spec  # part of the default `docker compose up`
    assert _serve_args(service, tmp, public, {})[0] == service
    running = _start_healthy(service, tmp, public, {})  # no variables set: the default deployment
    assert running.stop() == 0


def test_sharded_profile_runs_two_replicas_that_agree(deployed):
    """``LAC_SHARDS=... docker compose --profile sharded up``: shuffler and shuffler-b serve as the two entries
    of one shard list, each with its own state volume, shuffler-b reading the shuffler's tokens file (so a
    client registered once is known to both, and both send it to the same replica)."""
    from lac.common.config import add_flags, load
    from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc
    from lac.shuffler.auth import add_client
    from lac.shuffler.config import ENV_PREFIX, ShufflerConfig
    from lac.shuffler.shards import assign_shard

    tmp, public = deployed
    spec = COMPOSE["services"]["shuffler-b"]
    assert spec["profiles"] == ["sharded"] and spec["build"]["args"]["COMPONENT"] == "shuffler"
    assert spec["depends_on"] == COMPOSE["services"]["shuffler"]["depends_on"]
    volumes = dict(v.split(":")[:2] for v in spec["volumes"])
    assert volumes["shuffler-b-state"] == "/var/lib/lac/shuffler"  # its own report log
    assert "shuffler-b-state" in COMPOSE["volumes"] and "shuffler-b-state" not in {
        v.split(":")[0] for v in COMPOSE["services"]["shuffler"]["volumes"]
    }
    assert "shuffler-state:/etc/lac/shard-a:ro" in spec["volumes"]
    # The default deployment stays one unsharded shuffler; shuffler-b alone refuses to start unsharded.
    assert _serve_args("shuffler", tmp, public, {})[1][-4:] == ["--shards", "", "--shard-name", ""]
    parser = argparse.ArgumentParser()
    add_flags(parser, ShufflerConfig, ENV_PREFIX)
    b_unsharded = parser.parse_args(_serve_args("shuffler-b", tmp, public, {})[1])
    with pytest.raises(ValueError, match="but shards is empty"):
        load(ShufflerConfig, ENV_PREFIX, flags=vars(b_unsharded), environ={})
    environ = {"LAC_SHARDS": SHARDS}
    token = add_client(tmp / "volumes" / "shuffler-state" / "clients.tokens", "compose-client")
    ca = tls.client_tls(str(tmp / "volumes" / "shuffler-tls" / "ca.pem"))
    assert spec["healthcheck"] == COMPOSE["services"]["shuffler"]["healthcheck"]  # run once, for the shuffler
    replicas = {}
    try:
        replicas["shuffler"] = _start_healthy("shuffler", tmp, public, environ)
        name, args = _serve_args("shuffler-b", tmp, public, environ)
        env = _env(tmp, _mounts("shuffler-b", tmp, public))
        replicas["shuffler-b"] = procs.start(name, args, tmp / "shuffler-b", timeout=60, env=env, tls=ca)
        names = {}
        for service, running in replicas.items():
            with tls.channel(running.address, ca) as ch:
                reply = shuffler_pb2_grpc.ShufflerStub(ch).GetShards(
                    shuffler_pb2.GetShardsRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=10
                )
            assert list(reply.shards) == SHARDS.split(",")
            assert reply.assigned_shard == assign_shard("token:compose-client", SHARDS.split(","))
            names[service] = reply.shard_name
        assert names == {"shuffler": "localhost:50051", "shuffler-b": "localhost:50053"}
        published = {s: COMPOSE["services"][s]["ports"][0].split(":")[0] for s in names}
        assert {s: n.split(":")[1] for s, n in names.items()} == published  # each name is its published port
    finally:
        for running in replicas.values():
            assert running.stop() == 0


def test_dockerfile_installs_one_component():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert 'pip install --no-cache-dir "./common[postgresql]" "./${COMPONENT}[postgresql]" $extra' in text
    assert 'if [ "${COMPONENT}" = curator ]; then extra="./client[glove] ./analyst ./curator[channel]"' in text
    assert "COPY analyst ./analyst" in text  # lac-curator depends on lac-analyst
    assert 'ENTRYPOINT ["lac"]' in text
    for mount in ("/etc/lac/keys", "/etc/lac/tls", "/keys/ca", "/keys/curator-tls", "/keys/shuffler-tls"):
        assert mount in text, f"{mount} must exist in the image, owned by the service user"


def test_every_volume_a_service_user_writes_is_made_in_the_image():
    """A named volume mounted where the image has no directory is created owned by root, and the service user
    (lac) could not write it: every volume (not read-only) of a service built from docker/Dockerfile is mounted on
    a directory the Dockerfile makes and gives to lac, unless the service runs as root (shuffler-ha-init, which
    hands its volumes to lac itself)."""
    steps = [" ".join(s.split()) for s in DOCKERFILE.replace("\\\n", " ").split("&&")]
    made = next(s for s in steps if s.startswith("mkdir -p /var/lib/lac")).split()[2:]
    for name, spec in COMPOSE["services"].items():
        if spec.get("build", {}).get("dockerfile") != "docker/Dockerfile" or spec.get("user") == "root":
            continue
        for v in spec.get("volumes", []):
            source, target, *mode = v.split(":")
            if source.startswith("./") or mode == ["ro"]:
                continue  # a bind mount of the repository's files, or one the service only reads
            assert target in made, (name, target)
    assert "chown -R lac /var/lib/lac /var/cache/lac /etc/lac /keys" in " ".join(steps)


def test_the_image_user_has_a_data_directory_of_its_own():
    """The service user has no home: LAC_DATA_DIR names a directory the Dockerfile makes and gives to that user (a
    named volume mounted there inherits the ownership), so the curator's embedding cache is never a temporary one."""
    data = IMAGE_ENV["LAC_DATA_DIR"]
    steps = [" ".join(s.split()) for s in DOCKERFILE.replace("\\\n", " ").split("&&")]
    made = next(s for s in steps if s.startswith("mkdir -p /var/lib/lac"))
    owned = next(s for s in steps if s.startswith("chown -R lac"))
    assert data in made.split() and data in owned.split(), (made, owned)
    volumes = {v.split(":")[1]: v.split(":")[0] for v in COMPOSE["services"]["curator"]["volumes"]}
    assert volumes[data] in COMPOSE["volumes"]  # the curator's built embedding survives a restart


def test_every_bind_mount_source_is_in_the_repository():
    """`docker compose up` works from a fresh clone: every ``./`` volume source of every service (every profile)
    exists in the repository, every other source is a named volume the file declares, and no file a service's
    command reads from its image is left to the operator to provide (the curator's public corpus is built into its
    image: the next test)."""
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    )
    for name, spec in COMPOSE["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/", "~")):
                assert source.startswith("./"), f"{name} mounts {source}: only paths in the repository"
                local = (ROOT / source).resolve().relative_to(ROOT)
                assert any(f == str(local) or f.startswith(f"{local}/") for f in tracked), f"{name}: {source} missing"
            else:
                assert source in COMPOSE["volumes"], f"{name} mounts the undeclared volume {source}"
    command = COMPOSE["services"]["curator"]["command"]
    assert command[command.index("--public-corpus") + 1] == PUBLIC_CORPUS


def test_the_image_builds_the_public_corpus_lac_data_prepares(tmp_path):
    """The curator image's RUN step, run here from the source tree (only the gensim wheel's files are read, at the
    version the suite pins), writes the corpus `lac data` prepares."""
    from lac.suite.data import public_text

    (step,) = re.findall(r'python -c "([^"]*)"', DOCKERFILE)
    assert PUBLIC_CORPUS in step
    pin = next(
        d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if "gensim" in d
    )
    assert f"pip install --no-cache-dir --no-deps {pin}" in DOCKERFILE and "pip uninstall --yes gensim" in DOCKERFILE
    out = tmp_path / "public.txt"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'common'}{os.pathsep}{ROOT / 'suite'}"}
    subprocess.run([sys.executable, "-c", step.replace(PUBLIC_CORPUS, str(out))], check=True, env=env, timeout=120)
    text = out.read_text(encoding="utf-8")
    assert text == public_text() and len(text.split()) > 400_000


# -- the `monitoring` profile ----------------------------------------------------------------------------------

METRICS_SERVICES = ["curator", "shuffler", "shuffler-b"]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "lac.json"
PROMQL_FUNCTIONS = {
    "sum",
    "max",
    "min",
    "rate",
    "increase",
    "histogram_quantile",
    "by",
    "max_over_time",
    "absent",
    "time",
}
PROMETHEUS_SERIES = {"up"}  # written by Prometheus itself for every target it scrapes
PROMQL_KEYWORDS = {"deriv", "and", "or", "unless", "on", "ignoring", "without", "group_left", "group_right"}
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series
METRIC_PREFIXES = ("lac_", "process_", "python_")


def _flag(service: str, flag: str) -> str:
    command = COMPOSE["services"][service]["command"]
    return command[command.index(flag) + 1]


def _bind_mounts(service: str) -> dict[str, Path]:
    """container path -> repository path of the service's ./ bind mounts."""
    out = {}
    for v in COMPOSE["services"][service].get("volumes", []):
        source, target = v.split(":")[:2]
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def test_monitoring_profile_scrapes_metrics_on_internal_networks_only():
    """Prometheus and Grafana run only with ``--profile monitoring``, are published on the host's loopback only,
    read files that exist in the repository, and reach each service's metrics endpoint on an internal network
    that no other LAC service joins; no metrics port is published."""
    services, networks = COMPOSE["services"], COMPOSE["networks"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), services[name]["ports"]
        for target, local in _bind_mounts(name).items():
            assert local.exists(), f"{name} mounts {local} at {target}, which does not exist"
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    endpoints = set()
    for name in METRICS_SERVICES:
        spec = services[name]
        host, port = _flag(name, "--metrics-host"), _flag(name, "--metrics-port")
        endpoints.add(f"{host}:{port}")
        assert all(not p.endswith(f":{port}") for p in spec["ports"]), f"{name} publishes its metrics port"
        # The metrics host is the service's alias on an internal network; only Prometheus shares it.
        (network,) = [n for n, cfg in spec["networks"].items() if host in (cfg or {}).get("aliases", [])]
        assert networks[network]["internal"] is True and network in services["prometheus"]["networks"]
        members = {s for s, other in services.items() if network in (other.get("networks") or {})}
        assert members <= set(METRICS_SERVICES) | {"prometheus"}
        assert "curator" not in members or members == {"curator", "prometheus"}  # shufflers can't scrape it
    assert targets == endpoints
    # Grafana: the provisioned data source is this Prometheus, and the dashboard provider reads the mounted folder.
    mounts = _bind_mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "lac.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    dashboard = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {source["uid"]}


def _exposed(text: str) -> dict[str, set[str]]:
    """Metric name -> label names, of every sample and every declared family of a scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "info": ("",)}
    for family in text_string_to_metric_families(text):
        for suffix in suffixes.get(family.type, ("",)):
            out.setdefault(family.name + suffix, set())
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def _promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses; AssertionError for any other identifier."""
    labels: set[str] = set()
    text = re.sub(r'"[^"]*"', "", expr)
    grouping = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
    for group in re.findall(grouping, text):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    text = re.sub(grouping, "", text)
    for selector in re.findall(r"\{([^}]*)\}", text):
        labels.update(re.findall(r"([a-zA-Z_]\w*)\s*!?=~?", selector))
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b\d+(\.\d+)?\b", "", text)
    words = set(re.findall(r"[a-zA-Z_:][\w:]*", text))
    metrics = {w for w in words if w.startswith(METRIC_PREFIXES) or w in PROMETHEUS_SERIES}
    unknown = words - metrics - PROMQL_FUNCTIONS - PROMQL_KEYWORDS
    assert not unknown, f"unknown identifiers {unknown} in {expr}"
    return metrics, labels


def _exposed_by_services(start_curator, start_shuffler, curator_public_key, pki=None) -> dict[str, set[str]]:
    """``_exposed`` of a real shuffler and curator, started in-process and driven through Submit -> batch ->
    IngestBatch -> Release; with ``pki``, also of a shuffler with TLS certificates (and so their expiry)."""
    from lac_testkit import metrics_port, run_traffic, scrape

    cur = start_curator(metrics_port=0)
    shf = start_shuffler(cur.address, min_batch=5, metrics_port=0)
    run_traffic(shf.address, cur.address, curator_public_key, good=4)
    servers = [shf, cur]
    if pki is not None:
        cert, key = pki.pem("shuffler")
        servers.append(
            start_shuffler("127.0.0.1:1", insecure=False, tls_cert=cert, tls_key=key, curator_ca=pki.ca, metrics_port=0)
        )
    exposed: dict[str, set[str]] = {}
    for server in servers:
        for name, labels in _exposed(scrape(metrics_port(server))[0]).items():
            exposed.setdefault(name, set()).update(labels)
    return exposed


def test_dashboard_queries_only_metrics_the_services_expose(start_curator, start_shuffler, curator_public_key):
    """Every panel of the Grafana dashboard queries metric names (and labels) that a real shuffler and curator,
    started in-process and driven through Submit -> batch -> IngestBatch -> Release, expose on /metrics."""
    exposed = _exposed_by_services(start_curator, start_shuffler, curator_public_key)
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(set(titles)) == len(titles) and len({p["id"] for p in dashboard["panels"]}) == len(titles)
    used = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            metrics, labels = _promql_names(target["expr"])
            assert metrics, f"{panel['title']}: {target['expr']} names no metric"
            missing = metrics - set(exposed)
            assert not missing, f"{panel['title']}: {sorted(missing)} are not exposed"
            sampled = [exposed[m] for m in metrics if exposed[m]]  # a family without samples shows no labels
            have = set().union(*sampled)
            assert not sampled or labels <= have, f"{panel['title']}: labels {labels - have} not on {sorted(metrics)}"
            used |= metrics
    # What the dashboard must show: ingest, rejects, releases, budget, latency, storage and ingest workers' health.
    for name in (
        "lac_shuffler_reports_accepted_total",
        "lac_curator_reports_ingested_total",
        "lac_shuffler_rejects_total",
        "lac_curator_reports_rejected_total",
        "lac_curator_releases_total",
        "lac_curator_budget_epsilon_remaining",
        "lac_shuffler_rpc_seconds_bucket",
        "lac_curator_rpc_seconds_bucket",
        "lac_shuffler_storage_ok",
        "lac_curator_storage_ok",
        "lac_curator_ingest_pool_ok",
    ):
        assert name in used, f"the dashboard does not show {name}"


# -- alerting rules ----------------------------------------------------------------------------------------------

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"


def _alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_alert_rules_are_loaded_by_the_monitoring_profile():
    """prometheus.yml names alerts.yml relative to itself, and compose mounts it beside the config; every rule has
    a severity, a summary and a description, and the rules cover storage, ingest workers, backlog, budget and
    quarantine."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    mounts = _bind_mounts("prometheus")
    assert mounts["/etc/prometheus/prometheus.yml"].parent == mounts["/etc/prometheus/alerts.yml"].parent
    assert mounts["/etc/prometheus/alerts.yml"] == ALERTS
    rules = _alert_rules()
    names = [r["alert"] for r in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    used = set().union(*(_promql_names(r["expr"])[0] for r in rules))
    for name in (
        "lac_shuffler_storage_ok",
        "lac_curator_storage_ok",
        "lac_shuffler_batches_pending",
        "lac_shuffler_buffered_reports",
        "lac_shuffler_release_lease",
        "lac_curator_budget_epsilon_remaining",
        "lac_curator_reports_rejected_total",
        "lac_curator_ingest_pool_ok",
        "lac_curator_ingest_worker_deaths_total",
        "lac_curator_ingest_stalls_total",
        "up",
        "lac_tls_certificate_expiry_timestamp_seconds",
        "lac_shuffler_batches_dead_letter",
        "lac_shuffler_deployment_mismatch",
    ):
        assert name in used, f"no alert watches {name}"


def test_alert_rules_reference_only_metrics_the_services_expose(start_curator, start_shuffler, curator_public_key, pki):
    """Every metric an alert's expression names is exposed by a real shuffler or curator (or is Prometheus's
    ``up``), with the labels the expression and its annotations use (plus the instance and job Prometheus adds
    and the targets' labels in prometheus.yml)."""
    exposed = _exposed_by_services(start_curator, start_shuffler, curator_public_key, pki)
    prometheus = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    target_labels = {
        k for job in prometheus["scrape_configs"] for c in job["static_configs"] for k in c.get("labels", {})
    }
    for rule in _alert_rules():
        metrics, labels = _promql_names(rule["expr"])
        assert metrics, f"{rule['alert']} names no metric"
        missing = metrics - set(exposed) - PROMETHEUS_SERIES
        assert not missing, f"{rule['alert']}: {sorted(missing)} are not exposed"
        have = set().union(*(exposed[m] for m in metrics if m in exposed)) | SCRAPE_LABELS | target_labels
        templated = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        assert labels | templated <= have, f"{rule['alert']}: labels {(labels | templated) - have} not on {metrics}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_alert_rules_pass_promtool():
    """promtool parses the config and the rules (PromQL included) and runs the rules' unit tests, alerts.test.yml:
    each alert fires on the series it is meant for, after its `for`, and not before."""
    check = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(_alert_rules())} rules found" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yml"], capture_output=True, text=True, cwd=PROMETHEUS_DIR
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def _ha_args(service: str, tmp: Path, public: Path, replace: dict[str, str]) -> tuple[str, list[str]]:
    """``_serve_args`` of an `ha` service with the values of the flags in ``replace`` (its database, its curator)."""
    name, args = _serve_args(service, tmp, public, {})
    return name, [a for flag, value in zip(args[::2], args[1::2]) for a in (flag, replace.get(flag, value))]


@pytest.mark.slow
def test_the_ha_profile_runs_two_of_each_service_over_postgresql(deployed, postgres_cluster):
    """`docker compose --profile ha up`, run locally over a private PostgreSQL (one database per service, as the
    profile's two servers): the init step gives both shuffler replicas the key of their client hashes that `keys`
    made; two curators share one directory, two shufflers one tokens file; the SDK's failover reaches the other
    shuffler when the one it used is stopped, which knows the quota the client used there (one database), and both
    curators answer an operator."""
    from lac_testkit import hello_report

    from lac.client import AckStatus, QuotaExceeded, ShufflerClient
    from lac.common.v1 import curator_pb2, curator_pb2_grpc
    from lac.shuffler.auth import add_client

    tmp, public = deployed
    vol = tmp / "volumes"
    ha = [s for s, spec in COMPOSE["services"].items() if "ha" in spec.get("profiles", [])]
    assert sorted(ha) == sorted(
        ["postgres-shuffler", "postgres-curator", "curator-ha-a", "curator-ha-b", "shuffler-ha-init"]
        + ["shuffler-ha-a", "shuffler-ha-b"]
    )
    init = COMPOSE["services"]["shuffler-ha-init"]
    script = _map(init["command"][0], _mounts("shuffler-ha-init", tmp, public))
    if os.geteuid() != 0:
        script = script.replace("-o 10001 ", "")  # the container runs it as root, handing the files to lac
    subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=60)
    key = (vol / "shuffler-client-key" / "client.key").read_bytes()
    assert len(key) == 32
    for replica in ("a", "b"):
        assert (vol / f"shuffler-ha-{replica}-state" / "client.key").read_bytes() == key
    stores = {
        "curator": postgres_cluster.create_database("compose_ha_curator"),
        "shuffler": postgres_cluster.create_database("compose_ha_shuffler"),
    }
    for s in ha:
        if s.startswith(("curator-ha", "shuffler-ha-a", "shuffler-ha-b")):
            spec = COMPOSE["services"][s]
            service = s.split("-")[0]
            assert f"--store postgresql://lac_{service}@postgres-{service}:5432/lac_{service}" in " ".join(
                spec["command"]
            )
            assert spec["environment"]["PGPASSWORD"] == f"${{LAC_PG_{service.upper()}_PASSWORD}}"
    ca = str(vol / "curator-tls" / "ca.pem")
    operator = tls.client_tls(ca, str(vol / "ca" / "operator.pem"), str(vol / "ca" / "operator.key"))
    running: dict[str, procs.Service] = {}
    try:
        for s in ("curator-ha-a", "curator-ha-b"):  # one after the other: the first records the shared directory
            name, args = _ha_args(s, tmp, public, {"--store": stores["curator"]})
            env = _env(tmp, _mounts(s, tmp, public))
            running[s] = procs.start(name, args, tmp / s, timeout=120, env=env, tls=operator)
        token = add_client(vol / "shuffler-tokens" / "clients.tokens", "compose-ha-client")
        other = add_client(vol / "shuffler-tokens" / "clients.tokens", "compose-ha-client-2")
        shuffler_ca = tls.client_tls(str(vol / "shuffler-tls" / "ca.pem"))
        for s, curator in (("shuffler-ha-a", "curator-ha-a"), ("shuffler-ha-b", "curator-ha-b")):
            replace = {"--store": stores["shuffler"], "--curator": running[curator].address}
            name, args = _ha_args(s, tmp, public, replace)
            env = _env(tmp, _mounts(s, tmp, public))
            running[s] = procs.start(name, args, tmp / s, timeout=60, env=env, tls=shuffler_ca)
        addresses = [running["shuffler-ha-a"].address, running["shuffler-ha-b"].address]
        report = hello_report()
        curator_pub = vol / "curator-keys" / "curator.pub"
        with ShufflerClient.connect(addresses, curator_key=curator_pub, ca=ca, token=token, timeout=30) as c:
            assert [a.status for a in c.submit(report)] == [AckStatus.STORED]
            used = c.replica()
            stopped = next(s for s in ("shuffler-ha-a", "shuffler-ha-b") if running[s].address == used)
            assert running.pop(stopped).stop() == 0
            with pytest.raises(QuotaExceeded):  # the other replica knows the client's quota: one database
                c.submit(report)
            assert [a.status for a in c.submit(report, token=other)] == [AckStatus.STORED]
            assert c.replica() != used
        for s in ("curator-ha-a", "curator-ha-b"):
            with tls.channel(running[s].address, operator) as ch:
                status = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=30)
            assert status is not None
    finally:
        for proc in running.values():
            proc.stop()
