"""One server per port and per state directory, as real ``lac <role> serve`` processes: a second one is
refused in one line (not started beside the first, splitting its clients or writing its files), and
``lac <role> restore --force`` cannot replace the state of a running server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lac_testkit import ServeProc

pytestmark = pytest.mark.slow  # each test starts real server processes

ROLES = ("curator", "shuffler")


@pytest.fixture
def serve(tmp_path, public_corpus, sink):
    """Factory: a real ``lac ROLE serve`` on 127.0.0.1 (port 0) with state in ``state``; its flags for a
    second instance in ``serve.flags[ROLE](state)``."""
    procs: list[ServeProc] = []
    flags = {
        "curator": lambda state: [
            "--state-dir",
            str(state),
            "--public-corpus",
            str(public_corpus),
            "--vocab-min-count",
            "1",
            "--insecure",
            "--allow-plaintext-payloads",
            "--ingest-workers",
            "1",
        ],
        "shuffler": lambda state: [
            "--state-dir",
            str(state),
            "--curator",
            sink.address,
            "--auth",
            "none",
            "--insecure",
            "--allow-plaintext-payloads",
        ],
    }

    def start(role: str, state) -> ServeProc:
        proc = ServeProc(flags[role](state), tmp_path / f"run-{len(procs)}", timeout=90, service=role)
        procs.append(proc)
        return proc

    start.flags = flags
    yield start
    for p in procs:
        p.stop()


def _second(role: str, flags: list[str], timeout: float = 60.0) -> tuple[int, str]:
    """Run ``lac ROLE serve FLAGS`` that must refuse to start: (exit code, stderr). A server that starts
    anyway is stopped and fails the test."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lac.common", role, "serve", "--host", "127.0.0.1", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"a second {role} started (ran {timeout:g} s): {err[-2000:]}")
    return proc.returncode, err


def _last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("role", ROLES)
def test_a_second_server_on_a_taken_port_fails_in_one_line(role, serve, tmp_path):
    first = serve(role, tmp_path / "first")
    code, err = _second(role, [*serve.flags[role](tmp_path / "second"), "--port", str(first.port)])
    line = _last_line(err)
    assert code == 2, err
    assert line.startswith(f"lac {role} serve: error: port {first.port} on 127.0.0.1 is already in use"), line
    assert first.health() == "SERVING" and first.process.poll() is None


@pytest.mark.parametrize("role", ROLES)
def test_a_second_server_on_the_same_state_dir_fails_naming_the_holder(role, serve, tmp_path):
    state = tmp_path / "state"
    first = serve(role, state)
    code, err = _second(role, [*serve.flags[role](state), "--port", "0"])
    line = _last_line(err)
    assert code == 2, err
    assert f"{state} is in use by {role} (pid {first.pid})" in line, line
    assert first.health() == "SERVING"
    first.stop()  # the lock goes with its process
    again = serve(role, state)
    assert again.health() == "SERVING"


@pytest.mark.parametrize("role", ROLES)
def test_restore_force_into_a_running_servers_state_dir_is_refused(role, serve, tmp_path):
    state = tmp_path / "state"
    first = serve(role, state)
    lac = [sys.executable, "-m", "lac.common", role]
    backup = subprocess.run(
        [*lac, "backup", str(tmp_path / "backup"), "--state-dir", str(state)], capture_output=True, text=True
    )
    assert backup.returncode == 0, backup.stderr
    db = state / f"{role}.sqlite"
    before = db.stat()
    restore = [*lac, "restore", str(tmp_path / "backup"), "--state-dir", str(state), "--force"]
    refused = subprocess.run(restore, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = _last_line(refused.stderr)
    assert f"lac {role} restore: error: {state} is in use by {role} (pid {first.pid})" in line, line
    assert db.stat().st_ino == before.st_ino  # not replaced
    assert first.health() == "SERVING"
    first.stop()
    done = subprocess.run(restore, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
