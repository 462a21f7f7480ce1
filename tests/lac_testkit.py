"""Helpers shared by tests: report contents that satisfy the default deployment, batch statements."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import grpc

from lac.common.deployment import Deployment
from lac.common.serde import mechanism_id
from lac.common.v1 import curator_pb2, reports_pb2

ROOT = Path(__file__).resolve().parents[1]  # the repository
DEPLOYMENT = Deployment(exact_epsilon=True)  # what a curator with the default configuration publishes

# "Answered at once" vs "hung": a call whose promptness a test checks gets DEADLINE; a prompt answer comes
# well before it (under PROMPT, a third of it), a hung one only at it. Never a tight figure: tests run on
# loaded machines; how fast things are is the benchmarks' job (benchmarks/, BENCHMARKS.md).
DEADLINE = 30.0
PROMPT = DEADLINE / 3


def content(
    *sentences: list[str],
    report_id: bytes | None = None,
    epsilon: float = DEPLOYMENT.epsilon_per_word,
    mechanism: str = DEPLOYMENT.mechanism,
    embedding: str = DEPLOYMENT.embedding,
) -> reports_pb2.ReportContent:
    """A report's sealed content with the given sentences and typed local parameters."""
    return reports_pb2.ReportContent(
        report_id=report_id or os.urandom(16),
        sentences=[reports_pb2.Sentence(tokens=s) for s in sentences],
        local_privacy=reports_pb2.LocalPrivacy(
            mechanism=mechanism_id(mechanism), epsilon_per_word=epsilon, embedding=embedding
        ),
    )


def tag_of(p: reports_pb2.SealedPayload) -> bytes:
    """The report id inside a plaintext payload."""
    return reports_pb2.ReportContent.FromString(p.data).report_id


def batch_privacy(n: int, deployment: Deployment = DEPLOYMENT, window: int | None = None) -> reports_pb2.BatchPrivacy:
    """What a shuffler with a matching quota attaches to a batch of ``n`` reports of distinct clients."""
    w = deployment.window(time.time()) if window is None else window
    return reports_pb2.BatchPrivacy(
        n_reports=n,
        distinct_clients=True,
        reports_per_window=deployment.reports_per_window,
        window_seconds=deployment.window_seconds,
        first_window=w,
        last_window=w,
        windows_per_period=deployment.windows_per_period,
        period_seconds=deployment.period_seconds,
    )


class Sink:
    """A real gRPC server standing in for the curator (sync, own thread pool): CuratorIngest keeps
    every request's raw bytes; Curator.GetDeployment publishes ``deployment``."""

    def __init__(self, port: int = 0):
        from lac.common.deployment import Deployment

        self.raw: list[bytes] = []
        self.down = False
        self.refuse_batches = False  # IngestBatch answers UNAVAILABLE (after recording the try); GetDeployment works
        self.deployment = Deployment()
        self._lock = threading.Lock()
        from concurrent import futures

        self.server = grpc.server(
            futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)]
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._ingest,
            request_deserializer=None,
            response_serializer=curator_pb2.IngestBatchResponse.SerializeToString,
        )
        deployment = grpc.unary_unary_rpc_method_handler(
            self._deployment, request_deserializer=None, response_serializer=reports_pb2.Deployment.SerializeToString
        )
        self.server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler("lac.v1.CuratorIngest", {"IngestBatch": handler}),
                grpc.method_handlers_generic_handler("lac.v1.Curator", {"GetDeployment": deployment}),
            ]
        )
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ingest(self, raw: bytes, context):
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sink is down")
        request = curator_pb2.IngestBatchRequest.FromString(raw)
        with self._lock:
            self.raw.append(raw)
        if self.refuse_batches:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sink refuses batches")
        return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, accepted=len(request.reports))

    def _deployment(self, raw: bytes, context):
        from lac.common.serde import deployment_to_proto

        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sink is down")
        return deployment_to_proto(self.deployment)

    def batches(self) -> dict[str, curator_pb2.IngestBatchRequest]:
        """Distinct batches received (a batch re-sent after a crash has the same id and bytes)."""
        with self._lock:
            raws = list(self.raw)
        out = {}
        for raw in raws:
            b = curator_pb2.IngestBatchRequest.FromString(raw)
            out.setdefault(b.batch_id, b)
        return out

    def tags(self) -> list[bytes]:
        return [tag_of(p) for b in self.batches().values() for p in b.reports]

    def stop(self) -> None:
        self.server.stop(0)


def wait_until(predicate, timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it is true (AssertionError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def run_lac(capture, *argv: str) -> tuple[int, str, str]:
    """``lac ARGV`` in this process (``lac.common.cli.main``, every installed command): (exit code,
    stdout, stderr) as read by ``capture``, pytest's capsys or capfd fixture."""
    from lac.common.cli import main

    capture.readouterr()
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    out, err = capture.readouterr()
    return code, out, err


def draws_across_fork(draw) -> tuple[bytes, bytes]:
    """(what ``draw()`` returns in a child made by os.fork() now, what it returns in this process after).
    For generators built before a fork, whose child must not repeat the parent's noise."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one draw, then exit without running the parent's cleanup
        try:
            os.write(w, draw())
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while chunk := os.read(r, 1 << 16):
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return child, draw()


def run_traffic(
    shuffler: str, curator: str, curator_key, good: int = 4, release: bool = True
) -> curator_pb2.ReleaseRecord | None:
    """Real traffic through a shuffler (min_batch = ``good`` + 1, insecure) and its curator: one Submit refused
    (idempotency id too short), one Submit of ``good`` reports plus one the curator quarantines (ε per word
    above the deployment's), the batch forwarded and ingested, then (``release``) one forced release of
    ε = 0.5, δ = 1e-6, whose record is returned."""
    from lac.common import envelope
    from lac.common.v1 import curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc

    contents = [content(["the", "dog", "sleeps"]) for _ in range(good)]
    contents.append(content(["the", "cat"], epsilon=DEPLOYMENT.epsilon_per_word * 10))
    reports = [
        shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=envelope.seal(c, curator_key))
        for c in contents
    ]
    with grpc.insecure_channel(shuffler) as sch, grpc.insecure_channel(curator) as cch:
        stub = shuffler_pb2_grpc.ShufflerStub(sch)
        try:
            stub.Submit(
                shuffler_pb2.SubmitRequest(
                    reports=[shuffler_pb2.ClientReport(idempotency_id=b"1234", payload=reports[0].payload)]
                ),
                timeout=10,
            )
            raise AssertionError("a 4-byte idempotency id was accepted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        stub.Submit(shuffler_pb2.SubmitRequest(reports=reports), timeout=10)
        cur = curator_pb2_grpc.CuratorStub(cch)
        wait_until(lambda: cur.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).batches == 1)
        wait_until(lambda: stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=5).batches_forwarded == 1)
        if not release:
            return None
        return cur.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True), timeout=60)


def metrics_port(server) -> int:
    """The bound metrics port of a shuffler or curator started by the shared fixtures with ``metrics_port=0``."""
    service = getattr(server, "shuffler", None) or server.curator  # as the fixtures set them

    async def port():
        return await service.metrics_ready

    return server.call(port())


def scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    """(exposition text, content type) of ``GET http://127.0.0.1:PORT/metrics``."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read().decode(), reply.headers["Content-Type"]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus text exposition by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Pki:
    """A private CA under ``root`` (``lac.common.tls``, as ``lac keys tls`` makes it) with a certificate
    for each of ``names``, valid for localhost and 127.0.0.1."""

    def __init__(self, root, names=("curator", "shuffler", "analyst", "operator")):
        from lac.common import tls

        self.root = root
        tls.make_ca(root)
        for name in names:
            tls.issue(root, name, ["localhost", "127.0.0.1"])

    @property
    def ca(self) -> str:
        """Path of the CA certificate."""
        return str(self.root / "ca.pem")

    def pem(self, name: str) -> tuple[str, str]:
        """(certificate path, key path) of ``name``."""
        return str(self.root / f"{name}.pem"), str(self.root / f"{name}.key")

    def client_tls(self, name: str | None = None):
        """How a caller reaches a TLS service: trust the CA; with ``name``, present that certificate."""
        from lac.common.tls import ClientTls

        if name is None:
            return ClientTls(Path(self.ca))
        cert, key = self.pem(name)
        return ClientTls(Path(self.ca), Path(cert), Path(key))


def health(address: str, service: str = "", tls=None) -> str:
    """The gRPC health status name of ``service`` ("" = the server) at ``address`` (plaintext, or TLS with the
    ``lac.common.tls.ClientTls`` ``tls``), or the status code's name if the check fails."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from lac.common.tls import channel

    with channel(address, tls) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class ServeProc:
    """A real ``lac <service> serve`` process on 127.0.0.1 (``port``, 0 = any free one) whose output is read
    through a pipe into ``lines`` and ``log_path``: limits set on the process (RLIMIT_FSIZE) never touch
    its logging; ``env`` replaces its environment; ``tls`` (a ``ClientTls``) is how its health is asked when it
    serves TLS. ``stop()`` sends SIGTERM (graceful) and waits; ``kill()`` sends SIGKILL."""

    def __init__(
        self,
        args: list[str],
        workdir,
        timeout: float = 60.0,
        service: str = "shuffler",
        env: dict | None = None,
        tls=None,
        port: int = 0,
    ):
        import subprocess
        import sys

        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / f"{service}.port"
        port_file.unlink(missing_ok=True)
        self.log_path = workdir / f"{service}.log"
        self.tls = tls
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lac.common",
                service,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--port-file",
                str(port_file),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{service} did not start:\n" + "".join(self.lines[-30:]))
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        wait_until(lambda: self.health() == "SERVING", timeout=timeout)

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
        return health(self.address, service, self.tls)

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def rss_over_rounds(self, rounds: int, threads, join_seconds: float) -> tuple[list[int], float]:
        """Run ``rounds`` rounds of the threads ``threads()`` makes (started, then joined): the server's RSS
        before and after each round, and the seconds they took. With two rounds, the first fills what is
        bounded by design (allocator arenas of the server's threads, gRPC's buffers, caches); a leak keeps
        growing in the second."""
        rss, t0 = [self.rss_bytes()], time.monotonic()
        for _ in range(rounds):
            started = threads()
            for t in started:
                t.start()
            for t in started:
                t.join(join_seconds)
            rss.append(self.rss_bytes())
        return rss, time.monotonic() - t0

    def log_text(self) -> str:
        return "".join(self.lines)

    def metrics(self) -> str:
        """The Prometheus text of a process started with ``--metrics-port 0``."""
        import re
        import urllib.request

        port = next(
            int(m.group(1))
            for line in self.lines
            if (m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line))
        )
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        self.process.kill()
        self.process.wait()
        self._finish()

    def stop(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except Exception:
                self.process.kill()
                self.process.wait()
        self._finish()
        return self.process.returncode

    def _finish(self) -> None:
        """After the process ended: the reader drains the pipe to its end, then the pipe is closed."""
        self._reader.join(5)
        if not self._reader.is_alive():
            self.process.stdout.close()


def free_port() -> int:
    """A loopback port that was free a moment ago: for addresses that must be named before their
    server starts (shard lists, a Spark Connect endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mount_tmpfs(path, size: str) -> bool:
    """Mount a private tmpfs of ``size`` (e.g. "16m") at ``path``; False where this machine cannot
    (needs root / CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def fill(directory) -> None:
    """Fill the filesystem holding ``directory`` to the last byte (a file ``filler``)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


SEALED_TEXTS = [  # the sealed reports of ``mtls_curator_with_reports``: sentences of the conftest's public text
    ["the", "dog", "sleeps", "in", "the", "sun"],
    ["the", "fox", "is", "a", "small", "animal"],
    ["we", "walk", "the", "dog"],
    ["the", "sun", "is", "a", "star"],
]


def mtls_curator_with_reports(start_curator, pki, curator_public_key, n: int, window: int | None = None, **overrides):
    """A curator with mutual TLS (``start_curator`` fixture) holding ``n`` HPKE-sealed reports of
    ``SEALED_TEXTS``, ingested as the shuffler identity in one batch of ``window`` (default: the current one);
    returns the ServerThread."""
    from lac.common import envelope, tls
    from lac.common.v1 import curator_pb2_grpc

    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca, **overrides)
    with tls.channel(cur.address, pki.client_tls("shuffler")) as ch:
        reply = curator_pb2_grpc.CuratorIngestStub(ch).IngestBatch(
            curator_pb2.IngestBatchRequest(
                batch_id="b1",
                reports=[
                    envelope.seal(content(SEALED_TEXTS[i % len(SEALED_TEXTS)]), curator_public_key) for i in range(n)
                ],
                privacy=batch_privacy(n, window=window),
            ),
            timeout=30,
        )
    assert reply.accepted == n
    return cur


# A command that talks to a service (and so needs its address and files); a release with --counts runs offline.
_TALKS = re.compile(
    r"^lac (curator (release|status|budget|deployment|export|query \w+)|shuffler (status|flush)|health) "
)


def documented_commands(*pages: str) -> list[str]:
    """The commands that talk to a service in the shell blocks of ``pages`` (paths in the repository; of README.md,
    its services section, which the operator guide includes): continuation lines joined, ``;``-separated commands
    apart, trailing comments dropped, in the order shown."""
    found = []
    for page in pages:
        text = (ROOT / page).read_text(encoding="utf-8")
        if page == "README.md":
            text = text.split("<!-- --8<-- [start:services] -->")[1].split("<!-- --8<-- [end:services] -->")[0]
        for kind, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
            if kind not in ("", "sh", "bash"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                for command in line.split(";"):
                    command = " ".join(re.sub(r"\s#\s.*$", "", command).split())
                    if _TALKS.match(command) and "--counts" not in command:
                        found.append(command)
    return found


class BlockingAio:
    """``lac.client.AsyncShufflerClient(*args, **kwargs)`` on its own event loop behind the blocking client's
    methods (each awaited method called without ``await``; ``client`` is the asyncio client), so that one test
    checks both SDK clients."""

    def __init__(self, *args, **kwargs) -> None:
        import asyncio

        import lac.client

        self._loop = asyncio.Runner()
        self.client = lac.client.AsyncShufflerClient(*args, **kwargs)

    def __getattr__(self, name: str):
        import inspect

        method = getattr(self.client, name)
        if not inspect.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))

    def __enter__(self) -> BlockingAio:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self.client.close())
        self._loop.close()


def sdk_addresses_in_order(monkeypatch) -> None:
    """SDK clients made from now on (in this test) try their addresses in the order given: they start at a random
    one, to spread devices over the replicas."""
    import lac.client.submit

    monkeypatch.setattr(lac.client.submit, "randrange", lambda n: 0)


def hello_report():
    """A privatized report made by hand ("hello world", the default deployment's mechanism, ε and embedding), for
    tests where the shuffler carries it sealed and nothing reads its words."""
    from lac.client import PrivatizedReport
    from lac.common.deployment import DEFAULT_EMBEDDING

    return PrivatizedReport(
        sentences=(("hello", "world"),),
        n_words=2,
        mechanism="multivariate-laplace",
        epsilon_per_word=8.0,
        embedding=DEFAULT_EMBEDDING,
        guarantee=Deployment().word_guarantee(),
    )


class TcpFailover:
    """A TCP relay on 127.0.0.1 standing in for one name that resolves to several replicas (a load balancer in TCP
    mode): each connection goes to the first of ``backends`` (host:port) that accepts it, and its bytes pass through
    unread (TLS stays end to end; the certificate names 127.0.0.1). When a backend dies its connections close and
    the caller's next connection goes to the next backend. ``sent[backend]`` counts the bytes each was sent and
    ``last_sent[backend]`` says when (``time.monotonic()``)."""

    def __init__(self, backends: list[str]):
        import socket

        self.backends = list(backends)
        self.sent = dict.fromkeys(self.backends, 0)
        self.last_sent = dict.fromkeys(self.backends, 0.0)
        self._lock = threading.Lock()
        self._sockets: set = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn) -> None:
        import socket

        for backend in self.backends:
            host, port = backend.rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                continue
        else:
            conn.close()  # none accepts: the caller sees the connection closed, as with a name of dead addresses
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets |= {conn, upstream}
        threading.Thread(target=self._pump, args=(conn, upstream, backend), daemon=True).start()
        self._pump(upstream, conn, None)

    def _pump(self, source, sink, backend: str | None) -> None:
        import socket

        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                if backend is not None:
                    with self._lock:
                        self.sent[backend] += len(data)
                        self.last_sent[backend] = time.monotonic()
        except OSError:
            pass
        finally:  # one side ended: end both, as a TCP load balancer does
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            with self._lock:
                self._sockets -= {source, sink}

    def stop(self) -> None:
        self._listener.close()
        with self._lock:
            open_now = list(self._sockets)
        for s in open_now:
            s.close()


def ledger_of(records) -> dict[int, float]:
    """The ε each window's ledger should hold: the sum of the charges of the releases (``ReleaseRecord`` protos)
    covering it."""
    want: dict[int, float] = {}
    for r in records:
        for w in range(r.first_window, r.last_window + 1):
            want[w] = want.get(w, 0.0) + r.ledger_epsilon
    return want


def shuffler_replica_states(root: Path, n: int, tokens_file: Path) -> list[Path]:
    """The state directories ``root/state0`` … of ``n`` shuffler replicas over one database: each holds the same
    key of the client hashes (made here; a replica without it refuses to start) and a copy of ``tokens_file``."""
    from lac.shuffler.reportlog import KEY_FILE, write_key

    client_key = os.urandom(32)
    states = []
    for i in range(n):
        state = root / f"state{i}"
        state.mkdir(mode=0o700)
        write_key(state / KEY_FILE, client_key)
        (state / "clients.tokens").write_bytes(tokens_file.read_bytes())
        (state / "clients.tokens").chmod(0o600)
        states.append(state)
    return states


def lease_holders(addresses: list[str], operator_metadata, tls=None) -> list[str]:
    """The addresses among ``addresses`` (shuffler replicas) whose GetStatus says they hold the release lease."""
    from lac.common.tls import channel
    from lac.common.v1 import shuffler_pb2, shuffler_pb2_grpc

    held = []
    for address in addresses:
        with channel(address, tls) as ch:
            status = shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(
                shuffler_pb2.ShufflerStatusRequest(), metadata=operator_metadata, timeout=DEADLINE
            )
        if status.release_lease:
            held.append(address)
    return held


def postgres_tls(cluster, pki: Pki) -> str:
    """Turn TLS on in the private PostgreSQL ``cluster`` (``lac.common.pgcluster``) with a certificate for 127.0.0.1
    from ``pki``'s CA, and restart it; returns what a URL to it appends to insist on TLS and verify the server
    (``?sslmode=verify-full&sslrootcert=CA``)."""
    import shutil

    from lac.common import tls

    tls.issue(pki.root, "postgres", ["localhost", "127.0.0.1"])
    owner = cluster.dir.stat()
    for name in ("postgres.pem", "postgres.key"):
        shutil.copy(pki.root / name, cluster.dir / name)
        os.chown(cluster.dir / name, owner.st_uid, owner.st_gid)
        (cluster.dir / name).chmod(0o600)
    with open(cluster.data / "postgresql.conf", "a") as conf:
        conf.write(f"ssl = on\nssl_cert_file = '{cluster.dir / 'postgres.pem'}'\n")
        conf.write(f"ssl_key_file = '{cluster.dir / 'postgres.key'}'\n")
    cluster.restart()
    return f"?sslmode=verify-full&sslrootcert={pki.ca}"
