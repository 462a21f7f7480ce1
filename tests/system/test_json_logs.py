"""``--log-format json`` of real ``serve`` processes: every line either process writes is a JSON object
(gRPC's C-core lines included, as logger ``grpc.core``), and the values an operator filters on (batch
id, method, status code, reject reason, counts) are keys of the object, not only words in its message."""

from __future__ import annotations

import json

import pytest
from lac_testkit import ServeProc, run_traffic


@pytest.mark.slow  # two real processes and a release: 5-10 s
def test_every_line_is_json_and_fields_are_keys(
    tmp_path, public_corpus, curator_key_dir, curator_public_key, monkeypatch
):
    monkeypatch.setenv("GRPC_VERBOSITY", "debug")  # gRPC's C core then writes many lines of its own to stderr
    monkeypatch.setenv("GRPC_TRACE", "api")
    curator = ServeProc(
        [
            "--state-dir",
            str(tmp_path / "curator"),
            "--public-corpus",
            str(public_corpus),
            "--vocab-min-count",
            "1",
            "--key-dir",
            str(curator_key_dir),
            "--no-clean-estimate",
            "--min-signal-share",
            "0",
            "--insecure",
            "--log-format",
            "json",
        ],
        tmp_path / "curator-proc",
        service="curator",
    )
    try:
        shuffler = ServeProc(
            [
                "--state-dir",
                str(tmp_path / "shuffler"),
                "--curator",
                curator.address,
                "--min-batch",
                "5",
                "--insecure",
                "--auth",
                "none",
                "--log-format",
                "json",
            ],
            tmp_path / "shuffler-proc",
        )
        try:
            record = run_traffic(shuffler.address, curator.address, curator_public_key, good=4)
        finally:
            assert shuffler.stop() == 0
    finally:
        assert curator.stop() == 0
    assert record is not None

    logs = {}
    for name, proc in (("shuffler", shuffler), ("curator", curator)):
        lines = [line for line in proc.log_text().splitlines() if line.strip()]
        not_json = []
        for line in lines:
            try:
                assert isinstance(json.loads(line), dict)
            except (ValueError, AssertionError):
                not_json.append(line)
        assert not not_json, f"{name}: {len(not_json)} of {len(lines)} lines are not JSON objects: {not_json[:5]}"
        logs[name] = [json.loads(line) for line in lines]
        core = [r for r in logs[name] if r["logger"] == "grpc.core"]
        assert core and all({"time", "level", "message", "source"} <= set(r) for r in core), name
        assert {r["level"] for r in core} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}

    def one(name, **fields):
        found = [r for r in logs[name] if all(r.get(k) == v for k, v in fields.items())]
        assert len(found) == 1, (name, fields, found)
        return found[0]

    refused = one("shuffler", method="/lac.v1.Shuffler/Submit", status_code="INVALID_ARGUMENT")
    assert refused["reject_reason"] == "invalid_argument" and refused["level"] == "INFO"
    released = one("shuffler", reports=5, trigger="threshold")
    batch = released["batch_id"]
    assert isinstance(batch, str) and batch in released["message"]
    acked = one("shuffler", batch_id=batch, method="IngestBatch", status_code="OK")
    assert (acked["accepted"], acked["rejected"], acked["duplicate"]) == (4, 1, False)
    quarantined = one("curator", batch_id=batch, reject_reason="epsilon_too_large")
    assert quarantined["reports"] == 1 and quarantined["level"] == "WARNING"
    stored = one("curator", batch_id=batch, accepted=4)
    assert stored["rejected"] == 1 and stored["rejects"] == {"epsilon_too_large": 1}
    assert stored["first_window"] == stored["last_window"]
    released = one("curator", release_id=record.release_id)
    assert released["mechanism"] == record.mechanism and released["differentially_private"] is True
    assert (
        one("shuffler", service="shuffler", port=shuffler.port)["message"]
        == f"shuffler listening on port {shuffler.port}"
    )


def _lac(*argv: str, env: dict[str, str] | None = None, cwd=None) -> tuple[int, list[str]]:
    """(exit code, lines on stderr) of ``lac ARGV`` in a new process."""
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "lac.common", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    return run.returncode, [line for line in run.stderr.splitlines() if line.strip()]


@pytest.mark.slow  # six `lac ... serve` processes that fail at start: 5-15 s
def test_start_up_errors_are_json_at_critical(tmp_path, public_corpus):
    """With JSON logs asked for by flag, environment or TOML file, a serve that cannot start says why in one JSON
    object at level CRITICAL (its last line), whatever stopped it: a bad setting, a TLS file, a port in use, no
    key ring, an unknown flag. Without JSON logs it stays one plain line."""
    import socket

    (tmp_path / "json.toml").write_text('log_format = "json"\nmin_batch = 0\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        state = ["--state-dir", str(tmp_path / "state")]
        cases = {
            "a bad setting (flag)": (["shuffler", "serve", "--log-format", "json", "--min-batch", "0", *state], {}),
            "a bad setting (TOML)": (["shuffler", "serve", "--config", str(tmp_path / "json.toml"), *state], {}),
            "no TLS CA (env)": (
                ["shuffler", "serve", "--tls-cert", "s.pem", "--tls-key", "s.key", *state],
                {"LAC_SHUFFLER_LOG_FORMAT": "json"},
            ),
            "a port in use": (
                ["shuffler", "serve", "--log-format=json", "--port", port, "--insecure", "--auth", "none", *state],
                {},
            ),
            "no key ring": (
                ["curator", "serve", "--public-corpus", str(public_corpus), *state],
                {"LAC_CURATOR_LOG_FORMAT": "json"},
            ),
            "an unknown flag": (["shuffler", "serve", "--log-format", "json", "--min-bach", "5", *state], {}),
        }
        for case, (argv, env) in cases.items():
            code, lines = _lac(*argv, env=env, cwd=tmp_path)
            assert code == 2, (case, lines)
            records = []
            for line in lines:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    raise AssertionError(f"{case}: a line that is not JSON: {line}") from None
            last = records[-1]
            assert last["level"] == "CRITICAL" and last["logger"] == "lac", (case, last)
            assert last["message"].startswith(f"lac {argv[0]} serve: "), (case, last)
            assert not [r for r in records if r["logger"] == "stderr"], (case, records)
    code, lines = _lac("shuffler", "serve", "--min-batch", "0", *state, cwd=tmp_path)
    assert code == 2 and lines == [
        "lac shuffler serve: ValueError: min_batch must be at least 1 (run with -v for details)"
    ]


def test_the_relay_makes_a_python_traceback_one_error_record():
    """What a service's stderr relay (``lac.common.logs.relay``) makes of lines written outside its logging: a
    Python traceback (a worker process's, say) is one record at ERROR whose message is the exception's line, a
    fatal interpreter error is at CRITICAL, gRPC's own lines keep their level, and JSON lines pass unchanged."""
    import io

    from lac.common.logs import relay

    written = "\n".join(
        [
            '{"level": "INFO", "logger": "lac.x", "message": "started"}',
            "Traceback (most recent call last):",
            '  File "/srv/worker.py", line 3, in <module>',
            "    main()",
            "    ^^^^^^",
            "ValueError: the store is damaged",
            "E1127 17:20:01.123456   4242 chttp2_server.cc:1234] accept failed",
            "Fatal Python error: Segmentation fault",
            "a line of its own",
            "Traceback (most recent call last):",
            '  File "/srv/worker.py", line 9, in <module>',
        ]
    )
    out = io.StringIO()
    relay(io.StringIO(written + "\n"), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["level"], r["logger"], r["message"]) for r in records] == [
        ("INFO", "lac.x", "started"),
        ("ERROR", "stderr", "ValueError: the store is damaged"),
        ("ERROR", "grpc.core", "accept failed"),
        ("CRITICAL", "stderr", "Fatal Python error: Segmentation fault"),
        ("WARNING", "stderr", "a line of its own"),
        ("ERROR", "stderr", '  File "/srv/worker.py", line 9, in <module>'),  # cut short when the writer ended
    ]
    assert records[1]["exception"].splitlines()[0] == "Traceback (most recent call last):"
    assert records[1]["exception"].endswith("ValueError: the store is damaged")
