"""``lac dev up`` as a user runs it: one command to a local TLS stack (keys, certificates, tokens, a TLS
curator and shuffler as real processes), used with the SDK over TLS, stopped by Ctrl-C (SIGINT) and by
``lac dev down``, leaving a state directory the next ``up`` carries on from; and every ``lac curator``,
``lac shuffler`` and ``lac health`` command the README's services section, the operator guide and the analyst
guide show runs as written against it (through its profiles and env.sh)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from lac_testkit import documented_commands, wait_until

from lac.common import health, tls
from lac.common.statelock import StateDirLock
from lac.common.v1 import curator_pb2, curator_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _env(root: Path, **more: str) -> dict[str, str]:
    """The environment of ``lac dev up`` and of the commands run against it: its profiles in a file beside ROOT (never
    the user's), this venv's ``lac`` first on the PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "LAC_PROFILES": str(root.parent / "profiles.toml"), "PATH": path, **more}


def _up(root: Path, public_corpus: Path, *flags: str, **settings: str) -> tuple[subprocess.Popen, dict]:
    """Start ``lac dev up --dir ROOT FLAGS`` (the servers' ``settings`` in their environment variables) and wait until
    it says it is up (DIR/dev.json)."""
    env = _env(
        root,
        LAC_CURATOR_VOCAB_MIN_COUNT="1",  # the tests' tiny public corpus
        LAC_CURATOR_CLEAN_ESTIMATE="false",  # no local channel to sample: not what this test is about
        **settings,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "lac.common", "dev", "up", "--dir", str(root), "--public-corpus", str(public_corpus)]
        + list(flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not (root / "dev.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"lac dev up did not come up: {proc.communicate()[0]}")
        time.sleep(0.1)
    return proc, json.loads((root / "dev.json").read_text())


def _curator_reports(info: dict) -> int:
    f = info["files"]
    operator = tls.ClientTls(Path(f["ca"]), Path(f["operator_cert"]), Path(f["operator_key"]))
    with tls.channel(info["curator"]["address"], operator) as ch:
        return curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10).reports


def _lac(*argv: str, root: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``lac ARGV`` in its own process, in the environment of the dev stack in ``root``."""
    return subprocess.run(
        [sys.executable, "-m", "lac.common", *argv], capture_output=True, text=True, env=_env(root), timeout=timeout
    )


def _down(proc: subprocess.Popen, root: Path) -> str:
    """``lac dev down --dir ROOT`` (which must succeed), then all that ``lac dev up`` (``proc``) printed."""
    down = _lac("dev", "down", "--dir", str(root), root=root, timeout=90)
    assert down.returncode == 0, down.stderr
    return proc.communicate(timeout=60)[0]


def _kill(proc: subprocess.Popen) -> None:
    """A ``lac dev up`` a failed test left running: stopped as Ctrl-C does (its servers with it; killed only if that
    hangs), its pipe closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow  # two real servers, twice, and the GloVe embedding: 15-40 s
def test_dev_up_serves_tls_stops_on_ctrl_c_and_starts_again(tmp_path, public_corpus):
    from lac.client import ShufflerClient

    root = tmp_path / "lac-dev"
    proc, info = _up(root, public_corpus)
    try:
        f = info["files"]
        assert os.stat(f["client_token"]).st_mode & 0o077 == 0 and os.stat(root / "env.sh").st_mode & 0o077 == 0
        env = (root / "env.sh").read_text()
        assert f"export LAC_DEV_SHUFFLER={info['shuffler']['address']}" in env and "LAC_CLIENT_TOKEN=" in env
        assert f"export LAC_DEV_OPERATOR_CERT={f['operator_cert']}" in env
        profiles = tomllib.loads(Path(info["profiles"]["file"]).read_text())
        assert profiles["dev"]["curator"] == {
            "server": info["curator"]["address"],
            "ca": f["ca"],
            "cert": f["operator_cert"],
            "key": f["operator_key"],
        }
        assert profiles["dev"]["shuffler"]["token-file"] == f["operator_token"]
        assert profiles["dev-analyst"]["curator"]["cert"] == f["analyst_cert"]
        token = Path(f["client_token"]).read_text().strip()
        # The SDK over TLS, with the files `lac dev up` printed.
        with ShufflerClient.connect(
            info["shuffler"]["address"], curator_key=f["curator_key"], ca=f["ca"], token=token
        ) as client:
            localizer = client.localizer("balanced")
            acks = client.submit(localizer.privatize("hello world. my name is Bob and I live in Paris."))
        assert len(acks) == 1
        analyst = tls.ClientTls(Path(f["ca"]), Path(f["analyst_cert"]), Path(f["analyst_key"]))
        assert health.check(info["curator"]["address"], analyst, timeout=10)
        assert health.check(info["shuffler"]["address"], tls.ClientTls(Path(f["ca"])), timeout=10)
        wait_until(lambda: _curator_reports(info) == 1, timeout=30)  # min_batch 1: forwarded at once
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert "lac client submit" in out and "lac curator release" in out and info["shuffler"]["address"] in out
    assert "curator: local channel ready (read from its cache, or not used); releases run now" in out, out
    assert "stopped: shuffler (exit 0), curator (exit 0)" in out, out
    assert _gone(info["shuffler"]["pid"]) and _gone(info["curator"]["pid"])
    assert not (root / "dev.json").exists()
    for state in info["state_dirs"].values():  # both servers let go of their state directories
        StateDirLock(state, "test").release()

    # Up again on the same directory: the same keys and tokens, the report still stored; `lac dev down` stops it.
    ca = Path(f["ca"]).read_bytes()
    proc, again = _up(root, public_corpus)
    try:
        assert Path(again["files"]["ca"]).read_bytes() == ca
        assert Path(again["files"]["client_token"]).read_text().strip() == token
        assert _curator_reports(again) == 1
        out = _down(proc, root)
    finally:
        _kill(proc)
    assert proc.returncode == 0 and "stopped: shuffler (exit 0), curator (exit 0)" in out, out
    assert _gone(again["shuffler"]["pid"]) and _gone(again["curator"]["pid"])
    down = subprocess.run(
        [sys.executable, "-m", "lac.common", "dev", "down", "--dir", str(root)], capture_output=True, text=True
    )
    assert down.returncode == 2 and "no `lac dev up` is running" in down.stderr and down.stderr.count("\n") == 1


# -- the documentation's commands, as written ---------------------------------------------------------------------

DOCS = ("README.md", "docs/operator/index.md", "docs/analyst/index.md")
AGAINST_DEV = re.compile(r"--profile dev(-analyst|\.curator|\.shuffler)?\b|\$LAC_DEV_")


def test_the_docs_show_every_service_command_with_its_connection():
    """A command that talks to a service names where (``--profile`` or ``--server``): the operator guide's ``lac
    curator budget $TLS`` relied on the default address, which a deployment on other ports never answers."""
    commands = documented_commands(*DOCS)
    assert len(commands) >= 15
    assert not [c for c in commands if not AGAINST_DEV.search(c)], "not runnable against `lac dev up`"
    shown = " ".join(commands)
    for expected in (
        "lac shuffler status",
        "lac curator release",
        "--dry-run",
        "lac curator budget",
        "lac curator deployment",
        "lac curator status",
        "lac curator query top",
        "--profile dev-analyst",
        "lac health",
    ):
        assert expected in shown, expected


@pytest.mark.slow  # two real servers, the GloVe embedding and some fifteen commands in their own processes: 30-60 s
def test_the_docs_commands_run_as_written_against_dev_up(tmp_path, public_corpus):
    """``lac dev up`` (with one report in the curator and the accuracy check off, so a release of a tiny data set
    is made), then each documented command through bash, after ``source lac-dev/env.sh`` as the README says, in the
    directory holding lac-dev; RELEASE_ID is the release the first documented release made."""
    from lac.client import ShufflerClient

    root = tmp_path / "lac-dev"
    proc, info = _up(root, public_corpus, LAC_CURATOR_MIN_SIGNAL_SHARE="0")
    try:
        f = info["files"]
        with ShufflerClient.connect(
            info["shuffler"]["address"],
            curator_key=f["curator_key"],
            ca=f["ca"],
            token=Path(f["client_token"]).read_text().strip(),
        ) as client:
            client.submit(client.localizer("balanced").privatize("The dog sleeps in the sun. We walk the dog."))
        wait_until(lambda: _curator_reports(info) == 1, timeout=30)
        commands = documented_commands(*DOCS)
        ran: dict[str, str] = {}
        release_id = None
        for command in sorted(commands, key=lambda c: "RELEASE_ID" in c):  # a release first, then its queries
            if "RELEASE_ID" in command:
                assert release_id, "no documented release ran before the queries"
                command = command.replace("RELEASE_ID", release_id)
            done = subprocess.run(
                ["bash", "-c", f"source lac-dev/env.sh && {command}"],
                cwd=tmp_path,
                env=_env(root),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stdout, done.stderr)
            ran[command] = done.stdout
            made = re.match(r"release (\S+) \(", done.stdout)
            release_id = release_id or (made.group(1) if made else None)
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    assert "stopped: shuffler (exit 0), curator (exit 0)" in out, out
    by_start = {c.split(" --")[0]: out for c, out in ran.items()}
    assert "reports 1 (by window" in by_start["lac curator status"]  # the operator's certificate: exact counts
    assert "buffered" in by_start["lac shuffler status"]
    assert ": SERVING" in by_start["lac health"]
    assert "\\data\\" in (tmp_path / "release.arpa").read_text()


# -- lac dev up --ha ----------------------------------------------------------------------------------------------


@pytest.fixture
def ha_tmp():
    """A directory for `lac dev up --ha` and its profiles file outside pytest's tmp_path: as root the PostgreSQL server
    runs as postgres, which must get through every directory above DIR (/tmp/pytest-of-root is 0700). Mode 0711 lets
    it through, listing nothing."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="lac-dev-ha-"))
    path.chmod(0o711)
    yield path
    if (path / "lac-dev").exists():  # whatever a failed test left running (PostgreSQL above all) is stopped
        _lac("dev", "down", "--dir", str(path / "lac-dev"), root=path / "lac-dev")
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow  # PostgreSQL, four servers, twice: 40-120 s
def test_dev_up_ha_survives_a_shuffler_and_shares_releases_across_curators(
    ha_tmp, public_corpus, postgres_cluster, monkeypatch
):
    """``lac dev up --ha`` (postgres_cluster: the test skips only where no PostgreSQL server can run, never on CI):
    the SDK with the profile's replicas submits, one shuffler replica is killed, the next submit is still
    acknowledged (by the other), a release made on curator-a is read on curator-b, and `lac dev down` leaves no
    process; `up --ha` again on the same directory reuses the cluster and its reports, and after that `up` is
    killed, `lac dev down` stops what it left."""
    from lac_testkit import hello_report

    from lac.analyst import CuratorClient
    from lac.client import AckStatus, ShufflerClient
    from lac.common.profiles import profile

    root = ha_tmp / "lac-dev"
    proc, info = _up(root, public_corpus, "--ha", "--clients", "2", LAC_CURATOR_MIN_SIGNAL_SHARE="0")
    pids = {n: p["pid"] for n, p in info["processes"].items()} | {"postgresql": info["postgres"]["pid"]}
    try:
        assert sorted(info["processes"]) == ["curator-a", "curator-b", "shuffler-a", "shuffler-b"]
        assert not any(_gone(pid) for pid in pids.values())
        assert f"export LAC_DEV_CURATOR_B={info['processes']['curator-b']['address']}" in (root / "env.sh").read_text()
        monkeypatch.setenv("LAC_PROFILES", str(root.parent / "profiles.toml"))
        shuffler = profile("dev", "shuffler")
        replicas = [info["processes"][f"shuffler-{r}"]["address"] for r in "ab"]
        assert shuffler["replicas"] == replicas and shuffler["server"] == replicas[0]
        f = info["files"]
        tokens = [json.loads(line)["token"] for line in (root / "clients.jsonl").read_text().splitlines()]
        status = _lac("dev", "status", "--dir", str(root), root=root)
        assert status.returncode == 0 and status.stdout.count("SERVING") == 4, status.stdout + status.stderr
        assert re.search(rf"postgresql +127\.0\.0\.1:\d+ +pid {pids['postgresql']} +running", status.stdout)
        with ShufflerClient.connect(
            shuffler["replicas"], curator_key=f["curator_key"], ca=shuffler["ca"], token=tokens[0], timeout=30
        ) as client:
            assert [a.status for a in client.submit(hello_report())] == [AckStatus.STORED]
            used = client.replica()
            killed = next(n for n in ("shuffler-a", "shuffler-b") if info["processes"][n]["address"] == used)
            os.kill(pids[killed], signal.SIGKILL)
            wait_until(lambda: _gone(pids[killed]), timeout=30)
            acks = client.submit(hello_report(), token=tokens[1])  # the other client: the first used its quota
            assert [a.status for a in acks] == [AckStatus.STORED] and client.replica() != used
        wait_until(lambda: _curator_reports(info) == 2, timeout=60)  # the surviving replica forwards both
        status = _lac("dev", "status", "--dir", str(root), root=root)
        assert status.returncode == 1 and re.search(rf"{killed} .* exited", status.stdout), status.stdout
        assert status.stdout.count("SERVING") == 3, status.stdout
        analyst = {"ca": f["ca"], "cert": f["analyst_cert"], "key": f["analyst_key"]}
        with CuratorClient(info["processes"]["curator-a"]["address"], **analyst) as a:
            release_id = a.release(epsilon=1.0).release_id
        with CuratorClient(info["processes"]["curator-b"]["address"], **analyst) as b:
            assert len(b.top(release_id, k=5)) > 0
        out = _down(proc, root)
    finally:
        _kill(proc)
    assert proc.returncode == 0, out
    assert f"the {killed} exited with -9" in out and "still serves" in out, out
    assert "stopped: " in out and "postgresql (exit 0)" in out, out
    wait_until(lambda: all(_gone(pid) for pid in pids.values()), timeout=30)  # PostgreSQL's a moment after pg_ctl

    # Up again on the same directory: the same PostgreSQL cluster, both reports still there. Killed, it leaves its
    # servers and PostgreSQL running, which `lac dev down` stops.
    proc, again = _up(root, public_corpus, "--ha")
    try:
        assert again["postgres"]["data"] == info["postgres"]["data"]
        assert _curator_reports(again) == 2
        proc.kill()
        proc.communicate(timeout=30)  # and its pipe closed
        left = {n: p["pid"] for n, p in again["processes"].items()} | {"postgresql": again["postgres"]["pid"]}
        assert not any(_gone(pid) for pid in left.values())
        down = _lac("dev", "down", "--dir", str(root), root=root)
        assert down.returncode == 0 and "stopped what it left" in down.stdout, down.stderr
        wait_until(lambda: all(_gone(pid) for pid in left.values()), timeout=30)
    finally:
        _kill(proc)


def test_dev_up_ha_without_postgresql_says_what_to_install(tmp_path, public_corpus):
    """No server binaries ($LAC_PG_BIN names a directory without them): one line naming the package and the script,
    exit code 2, nothing made."""
    root = tmp_path / "lac-dev"
    env = {**_env(root), "LAC_PG_BIN": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "lac.common", "dev", "up", "--ha", "--dir", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "scripts/os_packages.sh postgresql" in done.stderr and "postgresql package" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not root.exists()


def test_dev_up_ha_without_psycopg_says_what_to_install(tmp_path, capsys, monkeypatch):
    """Without the services' postgresql extra (psycopg cannot be imported): one line with the pip command."""
    from lac_testkit import run_lac

    monkeypatch.setitem(sys.modules, "psycopg", None)  # what `import psycopg` meets where it is not installed
    code, _, err = run_lac(capsys, "dev", "up", "--ha", "--dir", str(tmp_path / "lac-dev"))
    assert code == 2 and "pip install './shuffler[postgresql]' './curator[postgresql]'" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "lac-dev").exists()


def test_one_directory_holds_one_kind_of_dev_stack(tmp_path, capsys):
    """`up --ha` on a directory with SQLite state and `up` on one with PostgreSQL refuse at once, saying why."""
    from lac_testkit import run_lac

    single, ha = tmp_path / "single", tmp_path / "ha"
    (single / "shuffler").mkdir(parents=True)
    (ha / "postgres").mkdir(parents=True)
    code, _, err = run_lac(capsys, "dev", "up", "--ha", "--dir", str(single))
    assert code == 2 and "one shuffler and one curator on SQLite" in err and "without --ha" in err, err
    code, _, err = run_lac(capsys, "dev", "up", "--dir", str(ha))
    assert code == 2 and "high-availability dev stack" in err and "lac dev up --ha" in err, err
