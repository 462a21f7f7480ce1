"""Start LAC services as separate processes on loopback and wait until they serve."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def address(self) -> str:
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


def start(name: str, args: list[str], workdir: Path, timeout: float = 120.0, env: dict | None = None) -> Service:
    """Run ``lac <name> serve <args> --port 0 --port-file ...`` and wait for SERVING health."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    cmd = [sys.executable, "-m", "lac.common", name, "serve", "--host", "127.0.0.1", "--port", "0",
           "--port-file", str(port_file), *args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{name} did not start within {timeout}s; log {log_path}:\n{_tail(log_path)}")
        time.sleep(0.05)
    service = Service(name, proc, int(port_file.read_text()), log_path)
    wait_serving(service.address, deadline - time.monotonic())
    return service


def wait_serving(address: str, timeout: float) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=max(timeout, 1.0),
                           wait_for_ready=True)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"{address} is not serving: {reply.status}")


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
