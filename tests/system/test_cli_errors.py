"""CLI error messages that name the real cause in one line (issue 25): a certificate with another's key, a
key without its certificate, and a server that requires a client certificate the command did not give (which
gRPC reports only as "Socket closed"); and a closed pipe ends a command quietly (issue 33)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lac_testkit import run_lac

from lac.common import tls
from lac.common.cli import SIGPIPE_EXIT


def _serve(service: str, tmp_path: Path, *flags: str) -> tuple[int, str]:
    """``lac SERVICE serve FLAGS`` as a real process that must fail at start: (exit code, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "lac.common", service, "serve", "--host", "127.0.0.1", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return done.returncode, done.stderr


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    return lines[-1]


def _curator_flags(tmp_path: Path, public_corpus: Path, curator_key_dir: Path) -> list[str]:
    return [
        "--state-dir",
        str(tmp_path / "cur"),
        "--public-corpus",
        str(public_corpus),
        "--key-dir",
        str(curator_key_dir),
    ]


def test_curator_with_another_certificates_key_says_so(tmp_path, pki, public_corpus, curator_key_dir):
    cert, _ = pki.pem("curator")
    _, other = pki.pem("shuffler")
    code, err = _serve(
        "curator",
        tmp_path,
        *_curator_flags(tmp_path, public_corpus, curator_key_dir),
        *("--tls-cert", cert, "--tls-key", other, "--tls-client-ca", pki.ca),
    )
    line = _last_line(err)
    assert code == 2
    assert f"the key {other} does not belong to the certificate {cert} (their public keys differ)" in line
    assert "bind" not in err and "cannot listen" not in err


@pytest.mark.slow
def test_shuffler_with_another_certificates_key_says_so(tmp_path, pki):
    cert, _ = pki.pem("shuffler")
    _, other = pki.pem("curator")
    flags = ("--state-dir", str(tmp_path / "shf"), "--curator", "127.0.0.1:1", "--curator-ca", pki.ca)
    code, err = _serve("shuffler", tmp_path, *flags, "--tls-cert", cert, "--tls-key", other)
    assert code == 2
    assert f"the key {other} does not belong to the certificate {cert}" in _last_line(err)
    # The certificate it shows the curator: refused at start, not left to a forwarder that could only log it.
    own = ("--tls-cert", cert, "--tls-key", pki.pem("shuffler")[1])
    code, err = _serve("shuffler", tmp_path, *flags, *own, "--curator-cert", cert, "--curator-key", other)
    assert code == 2
    assert f"the key {other} does not belong to the certificate {cert}" in _last_line(err)


@pytest.mark.slow
def test_a_key_without_its_certificate_names_serves_flags(tmp_path, pki):
    """``--tls-key`` alone is named as such, with the flag it lacks (not --cert/--key, which serve has not)."""
    _, key = pki.pem("shuffler")
    flags = ("--state-dir", str(tmp_path / "shf"), "--curator", "127.0.0.1:1", "--curator-ca", pki.ca)
    code, err = _serve("shuffler", tmp_path, *flags, "--tls-key", key)
    assert code == 2
    assert "--tls-key was given without --tls-cert" in _last_line(err) and "--cert " not in err
    code, err = _serve("shuffler", tmp_path, *flags, "--curator-cert", pki.pem("shuffler")[0])
    assert code == 2
    assert "--curator-cert was given without --curator-key" in _last_line(err)


def test_curator_key_without_its_certificate(tmp_path, pki, public_corpus, curator_key_dir):
    _, key = pki.pem("curator")
    flags = _curator_flags(tmp_path, public_corpus, curator_key_dir)
    code, err = _serve("curator", tmp_path, *flags, "--tls-key", key, "--tls-client-ca", pki.ca)
    assert code == 2
    assert "curator: --tls-key was given without --tls-cert" in _last_line(err) and "--cert " not in err


def test_server_tls_without_either_file_names_the_flags():
    with pytest.raises(ValueError, match=r"^curator: TLS needs --tls-cert and --tls-key .* or --insecure"):
        tls.server_tls("", "", name="curator")
    with pytest.raises(ValueError, match=r"^shuffler: --tls-cert was given without --tls-key"):
        tls.server_tls("a.pem", "", name="shuffler")


@pytest.mark.slow
def test_a_missing_client_certificate_is_named(capfd, pki, start_curator, start_shuffler):
    """The README's ``lac health --server HOST:PORT --ca ...`` against the curator, which requires mutual TLS,
    says that a client certificate is needed, not "Socket closed"; so does an analyst command."""
    cert, key = pki.pem("curator")
    cur = start_curator(insecure=False, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca)
    address = cur.address.replace("127.0.0.1", "localhost")
    for argv in (["health", "--server", address], ["curator", "budget", "--server", address]):
        code, out, err = run_lac(capfd, *argv, "--ca", pki.ca)
        assert code == 2 and out == ""
        assert err.splitlines()[-1].endswith(
            f"{address} requires a client certificate (mutual TLS) and none was given: pass --cert and --key "
            "(a certificate from `lac keys tls` signed by the server's client CA)"
        ), err
        assert "Socket closed" not in err
    analyst, analyst_key = pki.pem("analyst")
    code, out, _ = run_lac(
        capfd, "health", "--server", address, "--ca", pki.ca, "--cert", analyst, "--key", analyst_key
    )
    assert code == 0 and "SERVING" in out
    # A TLS server without a client CA answers a client without a certificate: not mistaken for mTLS.
    shf_cert, shf_key = pki.pem("shuffler")
    shf = start_shuffler(cur.address, insecure=False, tls_cert=shf_cert, tls_key=shf_key, curator_ca=pki.ca)
    assert not tls.requires_client_cert(shf.address.replace("127.0.0.1", "localhost"), Path(pki.ca))
    assert tls.requires_client_cert(address, Path(pki.ca))
    assert not tls.requires_client_cert("localhost:1", Path(pki.ca))  # nothing there: some other cause


def test_a_client_certificate_with_another_key_says_so(capfd, pki):
    cert, _ = pki.pem("analyst")
    _, other = pki.pem("operator")
    code, _, err = run_lac(capfd, "health", "--server", "localhost:1", "--ca", pki.ca, "--cert", cert, "--key", other)
    assert code == 2
    assert f"the key {other} does not belong to the certificate {cert}" in err.splitlines()[-1]


def _into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """``lac ARGV`` writing to a real pipe whose reader has already gone (as ``| head -1`` once it has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "lac.common", *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_the_command_quietly(start_shuffler, sink):
    """``lac shuffler status | head -1``: no BrokenPipeError traceback, nothing on stderr, exit code 141 (as a tool
    killed by SIGPIPE: the output was cut short). The same for argparse's own output (``--help``)."""
    shuffler = start_shuffler(sink.address)
    for argv in (["shuffler", "status", "--server", shuffler.address, "--insecure"], ["--help"], ["--version"]):
        done = _into_a_closed_pipe(*argv)
        assert (done.returncode, done.stderr) == (SIGPIPE_EXIT, ""), (argv, done.stderr)
    # A reader that stays gets everything, and the exit code is the command's.
    done = subprocess.run(
        [sys.executable, "-m", "lac.common", "shuffler", "status", "--server", shuffler.address, "--insecure"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "buffered" in done.stdout, done.stderr
