"""``lac dev up`` as a user runs it: one command to a local TLS stack (keys, certificates, tokens, a TLS
curator and shuffler as real processes), used with the SDK over TLS, stopped by Ctrl-C (SIGINT) and by
``lac dev down``, leaving a state directory the next ``up`` carries on from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lac_testkit import wait_until

from lac.common import health, tls
from lac.common.statelock import StateDirLock
from lac.common.v1 import curator_pb2, curator_pb2_grpc


def _up(root: Path, public_corpus: Path) -> tuple[subprocess.Popen, dict]:
    """Start ``lac dev up --dir ROOT`` and wait until it says it is up (DIR/dev.json)."""
    env = {
        **os.environ,
        "LAC_CURATOR_VOCAB_MIN_COUNT": "1",  # the tests' tiny public corpus
        "LAC_CURATOR_CLEAN_ESTIMATE": "false",  # no local channel to sample: not what this test is about
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "lac.common", "dev", "up", "--dir", str(root), "--public-corpus", str(public_corpus)],
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
        down = subprocess.run(
            [sys.executable, "-m", "lac.common", "dev", "down", "--dir", str(root)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert down.returncode == 0, down.stderr
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "stopped: shuffler (exit 0), curator (exit 0)" in out, out
    assert _gone(again["shuffler"]["pid"]) and _gone(again["curator"]["pid"])
    down = subprocess.run(
        [sys.executable, "-m", "lac.common", "dev", "down", "--dir", str(root)], capture_output=True, text=True
    )
    assert down.returncode == 2 and "no `lac dev up` is running" in down.stderr and down.stderr.count("\n") == 1
