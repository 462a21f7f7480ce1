"""Reports sealed to a key the curator cannot open are not sent (issue 23, item 9): the curator's deployment
publishes its key ids, the SDK checks its curator public key against them before sealing, and a curator that
could open no report (no key ring, TLS, sealed payloads only) does not start."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lac_testkit import hello_report, wait_until

from lac.client import AckStatus, DeploymentMismatch, ShufflerClient
from lac.common.envelope import CuratorKeyRing, generate_key


def _relayed(client: ShufflerClient) -> bool:
    try:
        client.deployment()
    except Exception:
        return False
    return True


def test_the_sdk_refuses_to_seal_to_a_key_the_curator_does_not_hold(
    start_curator, start_shuffler, curator_key_dir, tmp_path
):
    cur = start_curator()
    shf = start_shuffler(cur.address, min_batch=1000)
    ring = CuratorKeyRing.load(curator_key_dir)
    generate_key(tmp_path / "other")
    other = CuratorKeyRing.load(tmp_path / "other").public_key()
    with ShufflerClient(shf.address, curator_key=other, insecure=True, attempts=1, timeout=10) as wrong:
        wait_until(lambda: _relayed(wrong))  # the shuffler has fetched the curator's deployment
        assert wrong.deployment().key_ids == (ring.current,)
        with pytest.raises(DeploymentMismatch) as refused:
            wrong.submit(hello_report())
    message = str(refused.value)
    assert f"key id {other.key_id}" in message and ring.current in message and "Nothing was sent" in message
    assert shf.shuffler.buffered() == 0  # nothing stored, no quota spent
    with ShufflerClient(shf.address, curator_key=ring.public_key(), insecure=True, attempts=1, timeout=10) as right:
        assert [a.status for a in right.submit(hello_report())] == [AckStatus.STORED]


def test_a_tls_curator_without_a_key_ring_does_not_start(tmp_path, pki, public_corpus):
    cert, key = pki.pem("curator")
    argv = [sys.executable, "-m", "lac.common", "curator", "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--state-dir", str(tmp_path / "cur"), "--public-corpus", str(public_corpus)]
    argv += ["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki.ca]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:  # it started and served (the issue): a failure, not an error
        pytest.fail("a TLS curator without a key ring started")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert "no key ring (--key-dir)" in lines[0] and "lac keys curator" in lines[0]
