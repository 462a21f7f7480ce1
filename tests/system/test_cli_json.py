"""``--json`` of the curator's and the shuffler's commands: the reply as one JSON object whose 64-bit
integers are numbers (protobuf's JSON mapping writes them as strings), zeros included, through real servers."""

from __future__ import annotations

import json

import grpc
from lac_testkit import run_lac, run_traffic

from lac.common.cli import message_dict, message_json
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc


def test_message_dict_prints_64_bit_integers_as_numbers():
    big = 2**64 - 1  # beyond a double: a JSON number is still exact for Python's json
    status = curator_pb2.CuratorStatus(batches=big, reports=0, reports_by_window={-3: 7, 20_000: big}, releases=2)
    status.rejects["epsilon_too_large"] = 5
    status.windows.add(window=-(2**63), spent_epsilon=0.5)
    d = message_dict(status)
    assert d["batches"] == big and d["reports"] == 0 and d["releases"] == 2  # a zero count is printed
    assert d["reports_by_window"] == {"-3": 7, "20000": big}  # JSON object keys are strings; values numbers
    assert d["rejects"] == {"epsilon_too_large": 5} and d["windows"][0]["window"] == -(2**63)
    assert d["windows"][0]["remaining_epsilon"] == 0.0 and d["quarantined"] == 0
    assert json.loads(message_json(status)) == d
    listed = message_dict(
        curator_pb2.ListReleasesResponse(
            releases=[curator_pb2.ReleaseRecord(release_id="r", n_reports=12, first_window=-1, params={"W": 100.0})]
        )
    )
    record = listed["releases"][0]
    assert (record["n_reports"], record["first_window"], record["params"]) == (12, -1, {"W": 100.0})
    # proto3 optional fields appear only when set: an unset number of reports is not a count of 0
    assert "reports" not in message_dict(curator_pb2.ReleasePreview(mechanism="posterior"))
    assert message_dict(curator_pb2.ReleasePreview(reports=0, resolvable=[1, 2**40]))["reports"] == 0
    assert message_dict(curator_pb2.ReleasePreview(resolvable=[1, 2**40]))["resolvable"] == [1, 2**40]
    assert message_dict(shuffler_pb2.FlushResponse())["batch_size"] == 0


def test_status_json_of_both_services_has_numbers(start_curator, start_shuffler, curator_public_key, capsys):
    cur = start_curator()
    shf = start_shuffler(cur.address, min_batch=5)
    record = run_traffic(shf.address, cur.address, curator_public_key, good=4, release=True)

    code, out, err = run_lac(capsys, "curator", "status", "--server", cur.address, "--insecure", "--json")
    assert code == 0, err
    status = json.loads(out)
    with grpc.insecure_channel(cur.address) as ch:
        want = curator_pb2_grpc.CuratorStub(ch).GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)
    assert (status["batches"], status["reports"], status["quarantined"]) == (1, 4, 1)
    assert status["reports_by_window"] == {str(w): n for w, n in want.reports_by_window.items()}
    assert all(type(n) is int for n in status["reports_by_window"].values())
    assert [w["window"] for w in status["windows"]] == [w.window for w in want.windows]

    code, out, err = run_lac(capsys, "curator", "query", "releases", "--server", cur.address, "--insecure", "--json")
    assert code == 0, err
    (listed,) = json.loads(out)["releases"]
    assert listed["release_id"] == record.release_id and listed["n_reports"] == record.n_reports == 4
    assert type(listed["first_window"]) is int and listed["first_window"] == record.first_window

    code, out, err = run_lac(capsys, "shuffler", "status", "--server", shf.address, "--insecure", "--json")
    assert code == 0, err
    status = json.loads(out)
    with grpc.insecure_channel(shf.address) as ch:
        want = shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(shuffler_pb2.ShufflerStatusRequest(), timeout=10)
    assert (status["batches_forwarded"], status["reports_forwarded"], status["buffered_reports"]) == (1, 5, 0)
    assert status["window"] == want.window and status["counters"]["accepted"] == 5
    assert status["recent_batches"][0]["size"] == 5 and status["recent_batches"][0]["privacy"]["n_reports"] == 5

    code, out, err = run_lac(capsys, "shuffler", "flush", "--server", shf.address, "--insecure", "--json")
    assert code == 0, err
    flushed = json.loads(out)
    assert flushed["released"] is False and flushed["batch_size"] == 0 and flushed["note"]
