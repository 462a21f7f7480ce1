"""Shared fixtures: real servers on ephemeral loopback ports, small real texts."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from functools import partial
from pathlib import Path

import pytest
from lac_testkit import wait_until

# A small public text (the opening of the Wikipedia excerpt style), enough for a tiny prior.
PUBLIC_TEXT = """The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
A fox is a small animal. The sun is a star. The dog and the fox are friends.
People like to walk in the park. The park is green in the spring. We walk the dog every day.
It is a good day to walk. The weather is nice today. I think the weather will be nice tomorrow."""


@pytest.fixture
def public_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "public.txt"
    path.write_text(PUBLIC_TEXT)
    return path


class ServerThread:
    """Runs an async LAC service (server + library object) on its own event loop thread."""

    def __init__(self, build):
        self._build = build  # coroutine function returning (server, port, on_stop)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self.server, self.port, self._on_stop = self.call(self._start())
        except BaseException:  # the service refused to start: no loop thread left behind
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
            raise

    async def _start(self):
        server, port, on_stop = await self._build()
        await server.start()
        return server, port, on_stop

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def _stop():
            await self.server.stop(1)
            if self._on_stop:
                await self._on_stop()

        self.call(_stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()  # its selector and self-pipe sockets; left to the GC they warn in a later test


@pytest.fixture(scope="session")
def curator_key_dir(tmp_path_factory) -> Path:
    """A real curator HPKE key ring (``lac keys curator``), shared by the session."""
    from lac.common.envelope import generate_key

    path = tmp_path_factory.mktemp("curator-keys")
    generate_key(path)
    return path


@pytest.fixture
def curator_public_key(curator_key_dir):
    from lac.common.envelope import CuratorKeyRing

    return CuratorKeyRing.load(curator_key_dir).public_key()


@pytest.fixture
def start_curator(tmp_path, public_corpus, curator_key_dir):
    """Factory: start an in-process curator on 127.0.0.1 (port 0 unless ``port=`` is given) with a tiny public
    prior."""
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service import lifecycle
    from lac.curator.service.config import CuratorConfig
    from lac.curator.service.server import create_server

    started = []

    def start(channel_progress=None, wait_channel=True, **overrides):
        """``channel_progress``: passed to the curator's state (a test can hold the channel's sampling with it);
        ``wait_channel``: return once the local channel is ready (releases answer UNAVAILABLE before)."""
        overrides.setdefault("state_dir", tmp_path / f"curator{len(started)}")
        overrides.setdefault("key_dir", curator_key_dir)
        overrides.setdefault("insecure", True)  # plaintext transport; tests of TLS pass their own material
        overrides.setdefault("min_signal_share", 0.0)  # tiny data sets; the accuracy check has its own tests
        overrides.setdefault("port", 0)
        config = CuratorConfig(public_corpus=public_corpus, vocab_min_count=1, **overrides)
        vocab = public_vocabulary(
            config.public_corpus,
            config.max_n,
            config.vocab_min_count,
            config.vocab_max_items,
            config.state_dir / "prior",
        )

        made = []

        async def build():
            state = lifecycle.open_state(config, vocab, channel_progress=channel_progress)
            made.append(state)
            server, port = create_server(state)
            lifecycle.start(state)
            return server, port, partial(lifecycle.stop, state)

        s = ServerThread(build)
        s.curator = made[0]  # the curator's state (lac.curator.service.state), for tests that look inside
        started.append(s)
        if wait_channel and config.clean_estimate:
            wait_until(lambda: s.curator.channel_progress.phase in ("ready", "failed"), timeout=120)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def start_shuffler(tmp_path):
    """Factory: start an in-process shuffler on 127.0.0.1 (port 0 unless ``port=`` is given) forwarding
    to ``curator`` (host:port)."""
    from lac.shuffler import lifecycle
    from lac.shuffler.config import ShufflerConfig
    from lac.shuffler.server import create_server

    started = []

    def start(curator: str, **overrides):
        overrides.setdefault("state_dir", tmp_path / f"shuffler{len(started)}")
        overrides.setdefault("auth", "none")  # tests of authentication pass auth="token"
        overrides.setdefault("insecure", True)  # plaintext transport; tests of TLS pass their own material
        overrides.setdefault("allow_plaintext_payloads", True)
        overrides.setdefault("port", 0)
        config = ShufflerConfig(curator=curator, **overrides)

        made = []

        async def build():
            state = lifecycle.open_state(config)
            made.append(state)
            server, port = create_server(state)
            lifecycle.start(state)
            return server, port, lambda: lifecycle.stop(state)

        s = ServerThread(build)
        s.shuffler = made[0]  # its ShufflerState, for tests that look inside
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def sink():
    """A real gRPC CuratorIngest (``lac_testkit.Sink``) that records every batch a shuffler forwards."""
    from lac_testkit import Sink

    s = Sink()
    yield s
    s.stop()


@pytest.fixture
def pki(tmp_path):
    """A private CA with certificates for curator, shuffler, analyst and operator (``lac_testkit.Pki``)."""
    from lac_testkit import Pki

    return Pki(tmp_path / "pki")


def _postgres_cluster():
    """A private PostgreSQL server (``lac.common.pgcluster``: Debian's postgresql package, which scripts/test.sh
    installs); the test skips only where none can run at all, and never on CI."""
    from lac.common.pgcluster import PostgresCluster, PostgresUnavailable

    try:
        import psycopg  # noqa: F401  (the services' postgresql extra)

        return PostgresCluster()
    except (ImportError, PostgresUnavailable) as exc:
        reason = f"no PostgreSQL server can run here: {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must run the PostgreSQL tests: scripts/test.sh installs what they need)")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_cluster():
    """The session's private PostgreSQL server (``_postgres_cluster``)."""
    cluster = _postgres_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def own_postgres_cluster():
    """A private PostgreSQL server for this test alone, which it may stop and restart."""
    cluster = _postgres_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster):
    """The URL of a new empty database on the session's PostgreSQL server, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres_cluster.create_database(name)
    yield url
    postgres_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request) -> str:
    """A service's ``store`` setting for each implementation: "" (SQLite in the state directory) and a fresh
    PostgreSQL database."""
    return "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
