"""The analyst's release knobs are the ``ReleaseRequest`` fields (``lac.common.v1``) but the common ones, read from
the message: a knob the curator gains over RPC is one of ``CuratorClient.release``/``preview`` without an edit of the
client. Both the curator's spelling ``S`` and the field's ``s`` set the field."""

from __future__ import annotations

import pytest

from lac.analyst import client
from lac.common.v1 import curator_pb2


def test_the_knobs_are_the_request_fields_but_the_common_ones():
    fields = {f.name for f in curator_pb2.ReleaseRequest.DESCRIPTOR.fields}
    assert set(client._KNOBS) == fields - client._RELEASE_COMMON | {"S"}
    assert set(client._KNOBS) == {
        "S", "s", "rho", "sensitivity", "calibration", "public_sensitivity", "discovery", "force", "expected_reports"
    }  # fmt: skip
    assert all(getattr(curator_pb2.ReleaseRequest(), target) is not None for target in client._KNOBS.values())


def test_a_knob_sets_its_field_and_an_unknown_one_is_refused():
    req = client.CuratorClient._release_request(1.0, None, "bayesian", None, None, {"S": 0.02, "rho": 0.7}, "release")
    assert (req.s, req.rho, req.mechanism) == (0.02, 0.7, "bayesian")
    with pytest.raises(TypeError, match=r"release\(\) got unknown knob\(s\) top; known: S, calibration"):
        client.CuratorClient._release_request(1.0, None, "", None, None, {"top": 3}, "release")
