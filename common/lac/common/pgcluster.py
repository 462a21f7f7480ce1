"""A private PostgreSQL cluster for the tests of both services and for local development: ``initdb`` into a new
temporary directory, the server on a loopback port with its unix socket in that directory, trust authentication for
the one role ``lac``. Given a ``directory`` (``lac dev up --ha``), the cluster is kept there instead: durable, started
again on a new port by the next ``PostgresCluster(directory=...)``, stopped but never removed by ``stop()``, with no
unix socket (its path could pass the 107 bytes a socket's name may have).

The server binaries are Debian's ``postgresql`` package (``scripts/os_packages.sh postgresql``), which puts them
under ``/usr/lib/postgresql/<version>/bin``, not on the PATH; ``$LAC_PG_BIN`` names another directory, and then
only that one is searched. PostgreSQL refuses to run as root: as root, the cluster runs as the ``postgres`` user the
package creates (``runuser``), owning its directory. Not for production: no password, fsync off unless ``durable``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = [
    "ClusterRunning",
    "PostgresCluster",
    "PostgresUnavailable",
    "server_account",
    "server_binaries",
    "stop_kept",
]

ROLE = "lac"
START_SECONDS = 120
RUN_AS = ["runuser", "-u", "postgres", "--"]  # as root: the server's tools run as its account


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be run here (why, and what to install)."""


class ClusterRunning(PostgresUnavailable):
    """A server already runs on the kept cluster's data directory (``pid``): another owner's, or one left behind."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


INSTALL = "install Debian's postgresql package (scripts/os_packages.sh postgresql)"


def server_binaries() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: ``$LAC_PG_BIN`` when set, else the newest
    ``/usr/lib/postgresql/*/bin``, else the PATH's."""
    if env := os.environ.get("LAC_PG_BIN"):
        candidates = [Path(env)]
        where = f"$LAC_PG_BIN ({env})"
    else:
        candidates = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )[::-1]
        if on_path := shutil.which("pg_ctl"):
            candidates.append(Path(on_path).resolve().parent)
        where = "/usr/lib/postgresql/*/bin or the PATH"
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    raise PostgresUnavailable(f"no PostgreSQL server binaries (initdb, pg_ctl) in {where}: {INSTALL}")


def server_account() -> pwd.struct_passwd | None:
    """The account the server runs as when this process is root (``postgres``; PostgreSQL refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root and there is no postgres user to run the server as (Debian's postgresql package "
            "creates it)"
        ) from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """A running private cluster (see the module doc); ``stop()`` ends it and removes its directory, unless it was
    given one to keep."""

    def __init__(self, durable: bool = False, directory: Path | None = None):
        self.bin = server_binaries()
        owner = server_account()
        self._as = RUN_AS if owner is not None else []
        self.kept = directory is not None
        if directory is None:
            self.dir = Path(tempfile.mkdtemp(prefix="lac-pg-"))
        else:
            self.dir = directory.resolve()
            self.dir.mkdir(mode=0o700, exist_ok=True)
        if owner is not None:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self.data = self.dir / "data"
        self.port = _free_port()
        self.log = self.dir / "server.log"
        made = False
        try:
            self._check_reachable()
            if self.kept and (self.data / "PG_VERSION").exists():
                self._check_reusable()
            else:
                made = True
                self._init(durable or self.kept)
            self.start()
        except BaseException:
            if not self.kept:
                shutil.rmtree(self.dir, ignore_errors=True)
            elif made:  # a half-made cluster would be refused as another version's next time
                shutil.rmtree(self.data, ignore_errors=True)
            raise

    def _init(self, durable: bool) -> None:
        nosync = () if durable else ("--no-sync",)
        self._pg("initdb", "-D", str(self.data), "-U", ROLE, "-A", "trust", "-E", "UTF8", *nosync)
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "" if self.kept else str(self.dir),
            "max_connections": "200",
            "fsync": "on" if durable else "off",
            "full_page_writes": "on" if durable else "off",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{k} = '{v}'\n" for k, v in settings.items())

    def _check_reachable(self) -> None:
        """As root, the server's account must be able to enter the directory (and every one above it)."""
        if self._as and subprocess.run([*self._as, "test", "-x", str(self.dir)], timeout=30).returncode != 0:
            raise PostgresUnavailable(
                f"the PostgreSQL server runs as the postgres user here (this process is root, which PostgreSQL "
                f"refuses), and that user cannot enter {self.dir}: use a directory it can reach, every directory on "
                f"the way letting it through (e.g. one under /tmp), or run as an ordinary user"
            )

    def _check_reusable(self) -> None:
        """A kept cluster is started again only by the server version that made it, and only when none runs on it."""
        made_by = (self.data / "PG_VERSION").read_text().strip()
        version = subprocess.run([str(self.bin / "pg_ctl"), "--version"], capture_output=True, text=True, timeout=30)
        here = m.group(1) if (m := re.search(r"\(PostgreSQL\) (\d+)", version.stdout)) else "unknown"
        if made_by != here:
            raise PostgresUnavailable(
                f"the PostgreSQL cluster in {self.data} was made by PostgreSQL {made_by} and the server here "
                f"({self.bin}) is {here}: start it with version {made_by}'s binaries ($LAC_PG_BIN), upgrade it with "
                f"pg_upgrade, or use another directory"
            )
        if (pid := self.running_pid()) is not None:
            raise ClusterRunning(f"a PostgreSQL server (pid {pid}) already runs on {self.data}", pid)

    def running_pid(self) -> int | None:
        """The process id of the server running on this cluster's data directory, if one runs."""
        return _running_pid(self.data, self._as, self.bin)

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

    def create_database(self, name: str, exist_ok: bool = False) -> str:
        """A new empty database (with ``exist_ok``, the one of that name if there is one); returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            if not (exist_ok and conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()):
                conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def stop(self) -> None:
        """Stop the server: a kept cluster gracefully (``fast``) and left in place, a temporary one at once
        (``immediate``) and removed."""
        if self.kept:
            if self.running_pid() is not None:
                self.stop_server("fast")
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop_server("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _running_pid(data: Path, run_as: list[str], bin_dir: Path) -> int | None:
    try:
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    r = subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "status", "-D", str(data)], capture_output=True, timeout=30)
    return pid if r.returncode == 0 else None


def stop_kept(directory: Path) -> int | None:
    """Stop (``fast``) a server left running on the kept cluster in ``directory`` (its owner was killed); returns its
    process id, or None when none ran."""
    data = directory / "data"
    if not (data / "postmaster.pid").exists():
        return None
    run_as = RUN_AS if server_account() is not None else []
    bin_dir = server_binaries()
    pid = _running_pid(data, run_as, bin_dir)
    if pid is not None:
        r = subprocess.run(
            [*run_as, str(bin_dir / "pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w", "-t", str(START_SECONDS)],
            capture_output=True,
            text=True,
            timeout=START_SECONDS + 30,
        )
        if r.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl stop -D {data} failed: {r.stderr.strip() or r.stdout.strip()}")
    return pid
