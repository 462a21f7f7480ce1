"""Start LAC services as separate processes on loopback and wait until they serve."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lac.common import health
from lac.common.tls import ClientTls


@dataclass
class Service:
    """A LAC service running as a child process on a local port, with its log file."""

    name: str
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        """Where to reach it: ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start(
    name: str,
    args: list[str],
    workdir: Path,
    timeout: float = 120.0,
    env: dict | None = None,
    tls: ClientTls | None = None,
    port: int = 0,
    label: str | None = None,
) -> Service:
    """Run ``lac <name> serve <args> --port PORT --port-file ...`` on 127.0.0.1 and wait for SERVING health.

    ``tls`` is how to reach the service for the health check when it serves TLS; ``port`` 0 is any free one;
    ``label`` (default ``name``) names the service and its files in ``workdir`` (``LABEL.log``, ``LABEL.port``), e.g.
    one replica of several.
    """
    label = label or name
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"{label}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{label}.log"
    cmd = [
        sys.executable,
        "-m",
        "lac.common",
        name,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        *args,
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{label} exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{label} did not start within {timeout}s; log {log_path}:\n{_tail(log_path)}")
        time.sleep(0.05)
    service = Service(label, proc, int(port_file.read_text()), log_path)
    try:
        if not health.check(service.address, tls, timeout=max(deadline - time.monotonic(), 1.0), wait=True):
            raise RuntimeError(f"{service.address} is not serving")
    except BaseException:
        service.stop(timeout=5)  # never leave a half-started server behind
        raise
    return service


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@dataclass
class LocalDeployment:
    """Keys and TLS material for running the services locally as in production: the curator's
    HPKE key ring, a private CA, certificates for curator, shuffler and an analyst."""

    root: Path

    @classmethod
    def create(cls, root: Path) -> LocalDeployment:
        """Make the curator's key ring, a private CA and certificates for curator, shuffler, analyst and operator
        under ``root``."""
        from lac.common import envelope, tls

        root.mkdir(parents=True, exist_ok=True)
        envelope.generate_key(root / "curator-keys")
        tls.make_ca(root / "tls")
        for name in ("curator", "shuffler", "analyst", "operator"):
            tls.issue(root / "tls", name, ["localhost", "127.0.0.1"])
        return cls(root)

    def _pem(self, name: str) -> tuple[str, str]:
        return str(self.root / "tls" / f"{name}.pem"), str(self.root / "tls" / f"{name}.key")

    @property
    def ca(self) -> str:
        """Path of the CA certificate (``ca.pem``)."""
        return str(self.root / "tls" / "ca.pem")

    def curator_args(self) -> list[str]:
        """The curator's command-line flags for its key ring and TLS (client certificates verified by the CA)."""
        cert, key = self._pem("curator")
        return [
            "--key-dir",
            str(self.root / "curator-keys"),
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-client-ca",
            self.ca,
        ]

    def shuffler_args(self) -> list[str]:
        """TLS for the shuffler's port (clients and operators identify with bearer tokens) and mTLS
        towards the curator (the shuffler's certificate is its ingest identity there)."""
        cert, key = self._pem("shuffler")
        return ["--tls-cert", cert, "--tls-key", key, "--curator-ca", self.ca]

    def client_tls(self, name: str | None = None) -> ClientTls:
        """How a client reaches the services: trust our CA; with ``name``, present that certificate."""
        if name is None:
            return ClientTls(Path(self.ca))
        cert, key = self._pem(name)
        return ClientTls(Path(self.ca), Path(cert), Path(key))

    def curator_public_key(self):
        """The curator's public key (``curator.pub``), to seal reports to."""
        from lac.common.envelope import CuratorPublicKey

        return CuratorPublicKey.load(self.root / "curator-keys" / "curator.pub")


class ChannelWatch:
    """Says when the curator's local channel is ready: a line with its progress every ``every`` seconds while
    the curator samples it (its first release answers UNAVAILABLE until then), one line when it is ready.
    Asks the curator's preview (free, public), as an analyst."""

    def __init__(self, address: str, tls: ClientTls, every: float = 10.0):
        self.address, self.tls, self.every = address, tls, every
        self.started = time.monotonic()
        self.asked = self.said = -math.inf
        self.done = False

    def poll(self) -> bool:
        """Ask the curator at most every 2 s; print what changed. True once the channel is ready."""
        from lac.analyst.client import AnalystError, CuratorClient

        now = time.monotonic()
        if self.done or now - self.asked < 2.0:
            return self.done
        self.asked = now
        try:
            with CuratorClient(self.address, ca=self.tls.ca, cert=self.tls.cert, key=self.tls.key) as c:
                # a preview of window 0 (free; answers before any report is stored, unlike the default span)
                status = c.preview(epsilon=1.0, first_window=0, last_window=0).channel_status
        except AnalystError:
            return False  # asked again at the next poll
        if not status:
            self.done = True
            how = (
                f"(waited {now - self.started:.0f} s)"
                if self.said > -math.inf
                else "(read from its cache, or not used)"
            )
            print(f"curator: local channel ready {how}; releases run now", flush=True)
        elif now - self.said >= self.every:
            self.said = now
            print(f"curator: {status.removeprefix('the curator is ')}; releases wait for it", flush=True)
        return self.done

    def wait(self, timeout: float) -> None:
        """Poll until the channel is ready (TimeoutError after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not self.poll():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the curator's local channel is not ready after {timeout:.0f} s")
            time.sleep(0.5)
