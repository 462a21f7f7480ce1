"""docker-compose.yml without a Docker engine: the key-generation script, every service command
and every health check are run locally with the volumes mapped to directories, and each image
installs only its own component."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lac.common import tls
from lac.suite import procs

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVERS = ["curator", "shuffler"]


def _mounts(service: str, tmp: Path, public_corpus: Path) -> list[tuple[str, str]]:
    """(container path, local path) for each volume of ``service``, longest first."""
    out = []
    for v in COMPOSE["services"][service]["volumes"]:
        source, target = v.split(":")[:2]
        local = public_corpus if source.startswith("./deploy/public.txt") else tmp / "volumes" / source
        if local != public_corpus:
            local.mkdir(parents=True, exist_ok=True)
        out.append((target, str(local)))
    return sorted(out, key=lambda m: -len(m[0]))


def _map(text: str, mounts) -> str:
    for target, local in mounts:
        text = text.replace(target, local)
    return text


def _env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, request):
    """Run the `keys` service's script locally once: the volumes every service then mounts."""
    tmp = tmp_path_factory.mktemp("compose")
    public = tmp / "public.txt"
    public.write_text("The cat sat on the mat. The dog sat on the log.\n" * 20)
    spec = COMPOSE["services"]["keys"]
    assert spec["entrypoint"] == ["sh", "-c"]
    script = _map(spec["command"][0], _mounts("keys", tmp, public))
    for _ in range(2):  # idempotent: a second `docker compose up` keeps the keys
        subprocess.run(["sh", "-c", script], check=True, env=_env(), capture_output=True, timeout=120)
    return tmp, public


def test_keys_go_only_where_they_belong(deployed):
    tmp, _ = deployed
    vol = tmp / "volumes"
    assert (vol / "curator-keys" / "keyring.json").exists() and (vol / "curator-keys" / "curator.pub").exists()
    assert sorted(p.name for p in (vol / "shuffler-tls").iterdir()) == ["ca.pem", "shuffler.key", "shuffler.pem"]
    assert sorted(p.name for p in (vol / "curator-tls").iterdir()) == ["ca.pem", "curator.key", "curator.pem"]
    shuffler_volumes = {v.split(":")[0] for v in COMPOSE["services"]["shuffler"]["volumes"]}
    assert "curator-keys" not in shuffler_volumes and "ca" not in shuffler_volumes
    assert "ca" not in {v.split(":")[0] for v in COMPOSE["services"]["curator"]["volumes"]}


@pytest.mark.parametrize("service", SERVERS)
def test_compose_service_starts_and_is_healthy(service, deployed):
    tmp, public = deployed
    spec = COMPOSE["services"][service]
    assert spec["build"]["args"]["COMPONENT"] == service
    assert spec["depends_on"]["keys"]["condition"] == "service_completed_successfully"
    mounts = _mounts(service, tmp, public)
    name, action, *rest = [_map(a, mounts) for a in spec["command"]]
    assert (name, action) == (service, "serve")
    args, it = [], iter(rest)
    for flag in it:
        value = next(it)
        if flag in ("--host", "--port", "--metrics-port"):
            continue  # procs.start binds 127.0.0.1:0
        if flag == "--curator":
            value = "127.0.0.1:1"  # nothing listening: the shuffler must still start and keep its batches
        args += [flag, value]
    check = spec["healthcheck"]["test"]
    assert check[0] == "CMD"
    cmd = [_map(a, mounts) for a in check[1:]]
    flags = dict(zip(cmd[3::2], cmd[4::2]))  # lac health ADDRESS --ca .. [--cert .. --key ..]
    probe_tls = tls.client_tls(flags["--ca"], flags.get("--cert", ""), flags.get("--key", ""))
    running = procs.start(name, args, tmp / service, timeout=60, env=_env(), tls=probe_tls)
    try:
        cmd = [running.address if a.startswith("127.0.0.1:") else a for a in cmd]
        probe = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        assert "SERVING" in probe.stdout
    finally:
        assert running.stop() == 0


def test_dockerfile_installs_one_component():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install --no-cache-dir ./common ./${COMPONENT}" in text
    assert 'ENTRYPOINT ["lac"]' in text
    for mount in ("/etc/lac/keys", "/etc/lac/tls", "/keys/ca", "/keys/curator-tls", "/keys/shuffler-tls"):
        assert mount in text, f"{mount} must exist in the image, owned by the service user"
