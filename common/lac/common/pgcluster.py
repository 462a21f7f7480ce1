"""A private PostgreSQL cluster for the tests of both services and for local development: ``initdb`` into a new
temporary directory, the server on a loopback port with its unix socket in that directory, trust authentication for
the one role ``lac``.

The server binaries are Debian's ``postgresql`` package (``scripts/os_packages.sh postgresql``), which puts them
under ``/usr/lib/postgresql/<version>/bin``, not on the PATH; ``$LAC_PG_BIN`` names another directory. PostgreSQL
refuses to run as root: as root, the cluster runs as the ``postgres`` user the package creates (``runuser``),
owning its directory. Not for production: no password, fsync off unless ``durable``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PostgresCluster", "PostgresUnavailable", "server_binaries"]

ROLE = "lac"
START_SECONDS = 120


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be run here (why, and what to install)."""


def server_binaries() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: ``$LAC_PG_BIN``, the newest ``/usr/lib/postgresql/*/bin``, or
    the PATH's."""
    env = os.environ.get("LAC_PG_BIN")
    candidates = [Path(env)] if env else []
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )[::-1]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) in $LAC_PG_BIN, /usr/lib/postgresql/*/bin or the PATH: "
        "install Debian's postgresql package (scripts/os_packages.sh postgresql)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """A running private cluster (see the module doc); ``stop()`` ends it and removes its directory."""

    def __init__(self, durable: bool = False):
        self.bin = server_binaries()
        self._as: list[str] = []
        owner = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root and there is no postgres user to run the server as (Debian's postgresql "
                    "package creates it)"
                ) from None
            self._as = ["runuser", "-u", "postgres", "--"]
        self.dir = Path(tempfile.mkdtemp(prefix="lac-pg-"))
        if owner is not None:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self.data = self.dir / "data"
        self.port = _free_port()
        self.log = self.dir / "server.log"
        try:
            self._pg("initdb", "-D", str(self.data), "-U", ROLE, "-A", "trust", "-E", "UTF8", "--no-sync")
            settings = {
                "listen_addresses": "127.0.0.1",
                "unix_socket_directories": str(self.dir),
                "max_connections": "200",
                "fsync": "on" if durable else "off",
                "full_page_writes": "on" if durable else "off",
            }
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.writelines(f"{k} = '{v}'\n" for k, v in settings.items())
            self.start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _pg(self, tool: str, *args: str) -> None:
        r = subprocess.run(
            [*self._as, str(self.bin / tool), *args], capture_output=True, text=True, timeout=START_SECONDS
        )
        if r.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(f"{tool} {' '.join(args)} failed: {r.stderr.strip() or r.stdout.strip()}\n{tail}")

    def start(self) -> None:
        self._pg("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_SECONDS),
                 "-o", f"-p {self.port}")  # fmt: skip

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m mode`` (``immediate``: as after a crash, recovering from the WAL)."""
        self._pg("pg_ctl", "restart", "-D", str(self.data), "-m", mode, "-l", str(self.log), "-w",
                 "-t", str(START_SECONDS), "-o", f"-p {self.port}")  # fmt: skip

    def stop_server(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", str(START_SECONDS))

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop_server("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
