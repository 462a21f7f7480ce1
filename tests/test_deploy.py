"""docker-compose.yml without a Docker engine: every service command is a real `lac`
subcommand that starts locally, and its image installs only its own component."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lac.suite import procs

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _local(command: list[str], tmp: Path, public_corpus: Path) -> tuple[str, list[str]]:
    """The compose command with container paths and fixed ports replaced for this machine."""
    name, action, *rest = command
    assert action == "serve"
    out, it = [], iter(rest)
    for flag in it:
        value = next(it)
        if flag in ("--host", "--port"):
            continue  # procs.start binds 127.0.0.1:0
        if flag == "--state-dir":
            value = str(tmp / name)
        elif flag == "--public-corpus":
            value = str(public_corpus)
        elif flag == "--curator":
            value = "127.0.0.1:1"  # nothing listening: the shuffler must still start and keep its batches
        out += [flag, value]
    return name, out


@pytest.mark.parametrize("service", sorted(COMPOSE["services"]))
def test_compose_service_starts_locally(service, tmp_path, public_corpus):
    spec = COMPOSE["services"][service]
    assert spec["build"]["args"]["COMPONENT"] == service
    assert spec["healthcheck"]["test"][0] == "CMD"
    assert any(v.split(":")[1].startswith("/var/lib/lac/") for v in spec["volumes"])
    name, args = _local(spec["command"], tmp_path, public_corpus)
    running = procs.start(name, args, tmp_path, timeout=60)
    assert running.stop() == 0


def test_dockerfile_installs_one_component():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install --no-cache-dir ./common ./${COMPONENT}" in text
    assert 'ENTRYPOINT ["lac"]' in text
