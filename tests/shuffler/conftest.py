"""Shuffler test helpers: plaintext reports and a real gRPC CuratorIngest that records the wire."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from lac.common.v1 import reports_pb2, shuffler_pb2
from lac_testkit import Sink, tag_of  # noqa: F401 - re-exported for the shuffler tests


def payload(tag: bytes, size: int = 0) -> reports_pb2.SealedPayload:
    """A plaintext payload whose content is a ReportContent with report_id = ``tag``."""
    from lac_testkit import content

    c = content(["x" * size or "w"], report_id=tag)
    return reports_pb2.SealedPayload(encoding=reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE,
                                     data=c.SerializeToString())


def report(tag: bytes | None = None, crowd: str = "", idem: bytes | None = None) -> shuffler_pb2.ClientReport:
    return shuffler_pb2.ClientReport(idempotency_id=idem or os.urandom(16), payload=payload(tag or os.urandom(16)),
                                     crowd_id=crowd)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()


class ServeProc:
    """A real ``lac shuffler serve`` process on 127.0.0.1 (port 0) whose output is read through a
    pipe into ``lines`` and ``log_path``: limits set on the process (RLIMIT_FSIZE) never touch
    its logging. ``stop()`` sends SIGTERM (graceful) and waits."""

    def __init__(self, args: list[str], workdir, timeout: float = 60.0):
        import subprocess
        import sys

        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / "shuffler.port"
        port_file.unlink(missing_ok=True)
        self.log_path = workdir / "shuffler.log"
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lac.common", "shuffler", "serve", "--host", "127.0.0.1", "--port", "0",
             "--port-file", str(port_file), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("shuffler did not start:\n" + "".join(self.lines[-30:]))
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        wait_for(lambda: self.health() == "SERVING", timeout=timeout)

    def _read(self) -> None:
        with open(self.log_path, "a") as out:
            for line in self.process.stdout:
                self.lines.append(line)
                out.write(line)
                out.flush()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def health(self, service: str = "") -> str:
        """The gRPC health status name of ``service`` ("" = the server)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(self.address) as ch:
            try:
                reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=5)
            except grpc.RpcError as exc:
                return exc.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def rss_bytes(self) -> int:
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log_text(self) -> str:
        return "".join(self.lines)

    def metrics(self) -> str:
        """The Prometheus text of a process started with ``--metrics-port 0``."""
        import re
        import urllib.request

        port = next(int(m.group(1)) for line in self.lines
                    if (m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)))
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    def stop(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except Exception:  # noqa: BLE001 - then kill it
                self.process.kill()
                self.process.wait()
        self._reader.join(5)
        return self.process.returncode


def free_port() -> int:
    """A loopback port that was free a moment ago: for shard lists, which name the replicas' addresses
    before the replicas start."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_replica(start_shuffler, tmp_path):
    """Factory: ``start_replica(port, curator, **overrides)`` runs an in-process shuffler on
    127.0.0.1:``port`` (a port chosen first, so that shard lists can name it) with token
    authentication and the tokens file ``tmp_path / "replicas.tokens"`` shared by all replicas.
    Stopped at teardown; ``.stop()`` earlier frees the port for a restart."""

    def start(port: int, curator: str, **overrides):
        overrides.setdefault("state_dir", tmp_path / f"replica-{port}")
        overrides.setdefault("tokens_file", tmp_path / "replicas.tokens")
        overrides.setdefault("auth", "token")
        return start_shuffler(curator, port=port, **overrides)

    return start
