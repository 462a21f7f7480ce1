"""OpenTelemetry tracing (``lac.common.tracing``, the ``lac-common[tracing]`` extra): a report batch's path
app -> shuffler Submit, and shuffler delivery -> curator IngestBatch, as linked spans of real servers; the
shuffle is where traces stop; no payload, token, identity or report content in any span."""

from __future__ import annotations

import base64
import json

import grpc
import pytest
from lac_testkit import content, wait_until

from lac.client import ShufflerClient
from lac.common import envelope, tracing
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc
from lac.shuffler.auth import add_client

pytest.importorskip("opentelemetry.sdk.trace")


@pytest.fixture
def spans():
    """Tracing on for this test, into memory; the finished spans by name."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    assert tracing.configure("lac-test", exporter=exporter)
    yield exporter
    tracing.shutdown()
    assert not tracing.enabled() and tracing.server_interceptors() == [] and tracing.inject() == ()


def _by_name(exporter) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out


def test_a_batch_is_followed_from_the_app_to_the_curator(
    spans, start_curator, start_shuffler, tmp_path, curator_public_key
):
    state = tmp_path / "shuffler"
    token = add_client(state / "clients.tokens", "alice-secret-id")
    cur = start_curator()
    shf = start_shuffler(cur.address, auth="token", state_dir=state, min_batch=1)
    sealed = envelope.seal(content(["the", "dog", "sleeps"]), curator_public_key)
    report = shuffler_pb2.ClientReport(idempotency_id=b"idem-0123456789", payload=sealed)
    with grpc.insecure_channel(shf.address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Submit(shuffler_pb2.SubmitRequest(reports=[report]), metadata=(("authorization", "Bearer nope"),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # the app's own span around an SDK call: the SDK sends its context in traceparent
    with (
        tracing.span("app.submit", client=True),
        ShufflerClient(
            shf.address, curator_key=curator_public_key, token=token, insecure=True, attempts=1, timeout=10
        ) as client,
    ):
        client.submit_prepared([report])
    with grpc.insecure_channel(cur.address) as ch:
        stub = curator_pb2_grpc.CuratorStub(ch)
        wait_until(lambda: stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=5).reports == 1)
        record = stub.Release(curator_pb2.ReleaseRequest(epsilon=0.5, delta=1e-6, force=True), timeout=60)
    wait_until(lambda: "lac.v1.CuratorIngest/IngestBatch" in _by_name(spans))
    found = _by_name(spans)

    # app -> shuffler: the Submit span starts a trace of its own, not linked to the app's (trace_link_callers off),
    # so an app's trace store and the shuffler's hold no common trace id.
    (app,) = found["app.submit"]
    submits = found["lac.v1.Shuffler/Submit"]
    (ok,) = [s for s in submits if s.attributes["lac.status"] == "OK"]
    (bad,) = [s for s in submits if s.attributes["lac.status"] == "UNAUTHENTICATED"]
    assert ok.parent is None and ok.context.trace_id != app.context.trace_id and not ok.links
    assert f"{app.context.trace_id:032x}" not in ok.to_json()
    assert ok.attributes["lac.reports"] == 1 and ok.attributes["rpc.grpc.status_code"] == 0
    assert bad.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert bad.parent is None and not bad.events  # no exception (or its message) recorded

    # shuffler -> curator: the delivery is a new trace (the shuffle unlinks it from every Submit), and the
    # curator's ingest of the batch is its child.
    (forward,) = found["shuffler.forward_batch"]
    (ingest,) = found["lac.v1.CuratorIngest/IngestBatch"]
    batch = forward.attributes["lac.batch_id"]
    assert forward.parent is None and forward.context.trace_id != app.context.trace_id
    assert ingest.context.trace_id == forward.context.trace_id and ingest.parent.span_id == forward.context.span_id
    assert ingest.attributes["lac.batch_id"] == batch and ingest.attributes["lac.accepted"] == 1
    assert forward.attributes["lac.reports"] == 1 and forward.attributes["lac.accepted"] == 1
    (release,) = found["lac.v1.Curator/Release"]
    assert release.attributes["lac.release_id"] == record.release_id and release.attributes["lac.epsilon"] == 0.5

    # Nothing private in any span: no token, client id, payload, report content or metadata.
    everything = "\n".join(s.to_json() for s in spans.get_finished_spans())
    for secret in (
        token,
        "alice-secret-id",
        "sleeps",
        "authorization",
        "Bearer",
        sealed.data.hex(),
        base64.b64encode(sealed.data[:24]).decode(),
        "127.0.0.1",
    ):
        assert secret not in everything, secret
    keys = {k for s in spans.get_finished_spans() for k in s.attributes}
    assert keys <= tracing.ALLOWED
    assert all(not s.events for s in spans.get_finished_spans())
    for s in spans.get_finished_spans():
        json.loads(s.to_json())


def test_a_shuffler_links_its_spans_to_callers_only_if_told(spans, start_shuffler, sink):
    """With trace_link_callers the shuffler's server spans start new traces that carry a link to the caller's span
    (its traceparent); without, they start new traces and ignore it. The curator's spans are children of their
    caller's (an IngestBatch of the shuffler's forward_batch, an analyst's own spans)."""
    plain = start_shuffler(sink.address)
    linked = start_shuffler(sink.address, trace_link_callers=True)
    for shf in (plain, linked):
        with tracing.span("app.ask", client=True), grpc.insecure_channel(shf.address) as ch:
            stub = shuffler_pb2_grpc.ShufflerStub(ch)
            stub.GetShards(shuffler_pb2.GetShardsRequest(), metadata=tracing.inject(), timeout=10)
    apps = _by_name(spans)["app.ask"]
    asked = _by_name(spans)["lac.v1.Shuffler/GetShards"]
    assert len(apps) == len(asked) == 2
    for app, served in zip(apps, asked):
        assert served.parent is None and served.context.trace_id != app.context.trace_id
    assert not asked[0].links
    (link,) = asked[1].links
    assert (link.context.trace_id, link.context.span_id) == (apps[1].context.trace_id, apps[1].context.span_id)


def test_only_allowed_attributes_and_off_by_default():
    assert not tracing.enabled() and tracing.server_interceptors() == []
    with tracing.span("nothing", {"lac.batch_id": "b"}):  # a no-op when off
        tracing.set_attributes({"lac.reports": 1})
    assert tracing.inject() == ()
    assert tracing.configure("lac-test") is False  # nothing asked for: stays off
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracing.configure("lac-test", exporter=InMemorySpanExporter())
    try:
        assert tracing.inject() == ()  # on, but no current span: the SDK sends nothing
        from opentelemetry import baggage, context

        token = context.attach(baggage.set_baggage("user", "alice"))
        try:
            with tracing.span("app", client=True):
                assert [k for k, _ in tracing.inject()] == ["traceparent"]  # never the app's baggage
        finally:
            context.detach(token)
        with pytest.raises(ValueError, match="client_id"), tracing.span("x", {"client_id": "alice"}):
            pass
        with tracing.span("y"), pytest.raises(ValueError, match="payload"):
            tracing.set_attributes({"payload": b"sealed"})
    finally:
        tracing.shutdown()
