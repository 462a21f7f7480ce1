"""OpenTelemetry tracing of the services: off by default, and a no-op without the ``lac-common[tracing]`` extra.

``configure(service, otlp_endpoint=..., console=...)`` turns it on for this process (the services' settings
``otlp_endpoint`` and ``trace_console``); until then every function here does nothing and costs a check.

What is traced, so that a batch's path can be followed:

* every ``lac.v1`` RPC a server answers (``server_interceptors``): one SERVER span named after the method, with
  the status code. Its place relative to the caller's span, when the call carries a W3C ``traceparent`` header
  (the SDK sends the context of the app's current OpenTelemetry span with every call, ``inject``), is the
  server's choice (``CALLERS``): the curator's spans are children of the caller's (``"child"``: an
  IngestBatch of the shuffler's delivery, an analyst's own spans); the shuffler's start a new trace and ignore
  it (``"root"``), or, if its operator opts in (``trace_link_callers``), start a new trace with a link to the
  caller's span (``"link"``). An app's trace is its developer's: joined to the shuffler's Submit spans it
  would put the app's own view of a user (its spans' names, times and attributes) beside that user's
  submissions, so by default no trace id crosses from an app into a shuffler's spans;
* the shuffler's delivery of a batch: a root span (``shuffler.forward_batch``) whose context travels to the
  curator in the IngestBatch call, so the curator's ingest of that batch is its child.

The shuffle is where traces stop, on purpose: a batch's span is never linked to the Submit calls whose
reports it holds, since that link is exactly what shuffling removes. Spans carry method names, status
codes, batch and release ids, counts and public parameters (ε, δ, the mechanism), never a payload, a
token or other metadata, a client's identity, the peer's address, a report's content or an exception's
message (``set_attributes`` takes only the keys in ``ALLOWED``), and baggage from callers is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import grpc

log = logging.getLogger(__name__)

__all__ = [
    "ALLOWED",
    "TracingUnavailable",
    "configure",
    "configure_service",
    "enabled",
    "inject",
    "server_interceptors",
    "set_attributes",
    "shutdown",
    "span",
]

# Every attribute a LAC span may carry: public, or ids and counts that name no one.
ALLOWED = frozenset(
    {
        "rpc.system",
        "rpc.service",
        "rpc.method",
        "rpc.grpc.status_code",
        "lac.status",
        "lac.batch_id",
        "lac.release_id",
        "lac.reports",
        "lac.stored",
        "lac.accepted",
        "lac.rejected",
        "lac.duplicate",
        "lac.mechanism",
        "lac.epsilon",
        "lac.delta",
        "lac.first_window",
        "lac.last_window",
    }
)
TRACED_PREFIX = "/lac.v1."  # health checks and reflection are not traced
CALLERS = ("child", "root", "link")  # a server span's relation to the caller's: child of it, unrelated, linked

_tracer: Any = None  # an opentelemetry Tracer once configured
_provider: Any = None


class TracingUnavailable(RuntimeError):
    """Tracing was asked for but OpenTelemetry (the ``lac-common[tracing]`` extra) is not installed."""


def enabled() -> bool:
    """Whether this process traces (``configure`` was called with an exporter)."""
    return _tracer is not None


def configure(service: str, otlp_endpoint: str = "", console: bool = False, exporter: Any = None) -> bool:
    """Trace this process as ``service`` (e.g. ``lac-shuffler``) to an OTLP/HTTP collector at ``otlp_endpoint``,
    to stdout as one JSON object per span (``console``), and/or to ``exporter`` (any OpenTelemetry
    ``SpanExporter``, e.g. an in-memory one in tests). Nothing asked for: tracing stays off. Returns whether
    it is on; ``TracingUnavailable`` if it was asked for without the extra installed."""
    global _tracer, _provider
    if not (otlp_endpoint or console or exporter is not None):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing needs OpenTelemetry: pip install 'lac-common[tracing]' ({exc.name} is missing)"
        ) from None
    shutdown()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TracingUnavailable(
                f"--otlp-endpoint needs the OTLP exporter: pip install 'lac-common[tracing]' ({exc.name} is missing)"
            ) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if console:
        one_line = ConsoleSpanExporter(out=sys.stdout, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(one_line))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("lac")
    where = ", ".join(w for w in (otlp_endpoint, "stdout" if console else "", "an exporter" if exporter else "") if w)
    log.info("tracing on: spans of %s to %s (no payloads, tokens or identities)", service, where)
    return True


def configure_service(config: Any, service: str) -> None:
    """``configure`` from a service's settings (``otlp_endpoint``, ``trace_console``) as ``lac-<service>``;
    without the extra, a one-line SystemExit."""
    try:
        configure(f"lac-{service}", config.otlp_endpoint, config.trace_console)
    except TracingUnavailable as exc:
        raise SystemExit(f"error: {exc}") from None


def shutdown() -> None:
    """Export what is buffered and turn tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(attributes) - ALLOWED
    if unknown:
        raise ValueError(f"span attributes {sorted(unknown)} are not in lac.common.tracing.ALLOWED")
    return {k: v for k, v in attributes.items() if v is not None}


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Add ``attributes`` (keys from ``ALLOWED`` only) to the current span, if tracing is on."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_clean(attributes))


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, root: bool = False, client: bool = False
) -> Iterator[None]:
    """A span around the block (nothing when tracing is off). ``root``: start a new trace, whatever span is
    current; ``client``: a span of an outgoing call (``inject`` then carries it)."""
    if _tracer is None:
        yield
        return
    from opentelemetry import context, trace

    kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
    with _tracer.start_as_current_span(
        name,
        context=context.Context() if root else None,
        kind=kind,
        attributes=_clean(attributes or {}),
        record_exception=False,  # an exception's message may quote input
        set_status_on_exception=True,
    ):
        yield


def inject() -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying the current span's W3C context (``traceparent``, ``tracestate``; never baggage) to
    the server called: this process's span, or an app's own OpenTelemetry span around an SDK call. () without
    a current span or without OpenTelemetry installed."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return ()

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return tuple(carrier.items())


def _parent(metadata: Any) -> Any:
    """The caller's span context from a call's ``traceparent``/``tracestate`` headers (baggage is ignored)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k: v for k, v in (metadata or ()) if k in ("traceparent", "tracestate") and isinstance(v, str)}
    return TraceContextTextMapPropagator().extract(carrier)


def _links(metadata: Any) -> list[Any]:
    """A link to the caller's span, from its ``traceparent`` (none without a valid one)."""
    from opentelemetry import trace

    caller = trace.get_current_span(_parent(metadata)).get_span_context()
    return [trace.Link(caller)] if caller.is_valid else []


def server_interceptors(callers: str = "child") -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a server built now needs: one tracing ``lac.v1`` calls if tracing is on, else none.
    ``callers`` (``CALLERS``): each call's span is a child of the caller's span (``"child"``), starts a new trace
    ignoring it (``"root"``), or starts a new trace with a link to it (``"link"``)."""
    if callers not in CALLERS:
        raise ValueError(f"callers must be one of {', '.join(CALLERS)}, not {callers!r}")
    return [_ServerSpans(callers)] if _tracer is not None else []


class _ServerSpans(grpc.aio.ServerInterceptor):
    """One SERVER span per ``lac.v1`` call (method, status code), current while the method runs, placed relative
    to the caller's span as ``callers`` says."""

    def __init__(self, callers: str):
        self.callers = callers

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or _tracer is None or not method.startswith(TRACED_PREFIX):
            return handler
        service, _, name = method[1:].partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        metadata = handler_call_details.invocation_metadata
        caller = (  # (parent context, links); "root": a new trace, whatever the caller sent
            _parent(metadata) if self.callers == "child" else None,
            _links(metadata) if self.callers == "link" else [],
        )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _unary_reply(handler.stream_unary, method[1:], attributes, caller),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _streamed_reply(handler.stream_stream, method[1:], attributes, caller),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # LAC registers every method as request-streaming (lac.common.rpc)


@contextlib.contextmanager
def _server_span(name: str, attributes: dict[str, Any], caller: Any, context: Any) -> Iterator[None]:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    assert _tracer is not None
    parent, links = caller
    with _tracer.start_as_current_span(
        name,
        context=parent if parent is not None else otel_context.Context(),
        links=links,
        kind=trace.SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        failed = None
        try:
            yield
        except BaseException as exc:
            failed = exc
            raise
        finally:
            code = context.code()  # set by an abort
            if not isinstance(code, grpc.StatusCode):
                code = grpc.StatusCode.OK if failed is None else grpc.StatusCode.CANCELLED
            current.set_attribute("rpc.grpc.status_code", code.value[0])
            current.set_attribute("lac.status", code.name)
            if code is not grpc.StatusCode.OK:
                current.set_status(trace.Status(trace.StatusCode.ERROR))


def _unary_reply(inner: Any, name: str, attributes: dict[str, Any], caller: Any) -> Any:
    async def traced(requests: AsyncIterator[Any], context: Any) -> Any:
        with _server_span(name, attributes, caller, context):
            return await inner(requests, context)

    return traced


def _streamed_reply(inner: Any, name: str, attributes: dict[str, Any], caller: Any) -> Any:
    async def traced(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        with _server_span(name, attributes, caller, context):
            async for item in inner(requests, context):
                yield item

    return traced
