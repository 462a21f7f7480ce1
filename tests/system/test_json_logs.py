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
