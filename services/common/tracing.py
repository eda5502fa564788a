"""OpenTelemetry tracing: a tracer provider per process, gRPC interceptors, exporters.

Spans go to an OTLP collector when OTEL_EXPORTER_OTLP_ENDPOINT is set, and to a JSON-lines
file when a trace file is given (ROLLWAY_TRACE_FILE or --trace-file); the file exporter is
what tests and `rollway` debugging read. Trace context crosses services in gRPC metadata
(W3C traceparent), so a call from one service to another yields a child span.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Sequence

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status, StatusCode

_provider: TracerProvider | None = None
_trace_file: str | None = None
_lock = threading.Lock()


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (ids in hex, times in ns)."""

    def __init__(self, path: str):
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
                        "kind": span.kind.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "status": span.status.status_code.name,
                        "attributes": {k: _jsonable(v) for k, v in (span.attributes or {}).items()},
                    }
                )
            )
        with self._lock, open(self._path, "a") as f:
            f.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def configure_tracing(service: str, trace_file: str | None = None) -> TracerProvider:
    """Install the process-wide tracer provider for `service` (idempotent)."""
    global _provider, _trace_file
    with _lock:
        if _provider is not None:
            return _provider
        provider = TracerProvider(resource=Resource.create({"service.name": f"rollway-{service}"}))
        trace_file = trace_file or os.environ.get("ROLLWAY_TRACE_FILE")
        if trace_file:
            # Simple (synchronous) so spans are on disk when the call returns: tests read them.
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
            _trace_file = os.path.abspath(trace_file)
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _provider = provider
        return provider


def trace_file_environment() -> dict[str, str]:
    """ROLLWAY_TRACE_FILE naming this process's trace file (empty without one): processes it
    starts append their spans to the same file, so one file holds a run's whole story."""
    return {"ROLLWAY_TRACE_FILE": _trace_file} if _trace_file else {}


def shutdown_tracing() -> None:
    """Flush and stop exporters (call on process exit)."""
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str = "rollway") -> trace.Tracer:
    """A tracer from the process provider."""
    return trace.get_tracer(name)


def server_interceptor():
    """gRPC server interceptor that opens a SERVER span per call, parented by the caller's context."""
    from opentelemetry.instrumentation.grpc import server_interceptor as otel_server_interceptor

    return otel_server_interceptor(tracer_provider=_provider or trace.get_tracer_provider())


class TracingClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Opens a CLIENT span per call and injects W3C traceparent into the call's metadata.

    Unlike OpenTelemetry's own client interceptor, it returns grpc's call objects unchanged, so
    callers keep `cancel()`, `code()` and friends on streaming calls; the span ends when the call
    completes (done callback).
    """

    def _intercept(self, continuation, details, request):
        span = tracer("rollway.grpc").start_span(
            details.method.lstrip("/"),
            kind=trace.SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.method": details.method},
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        metadata = [*(details.metadata or ()), *carrier.items()]
        call = continuation(
            details._replace(metadata=metadata)
            if hasattr(details, "_replace")
            else _with_metadata(details, metadata),
            request,
        )

        def finish(done_call) -> None:
            code = done_call.code()
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code != grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, f"{code.name}: {done_call.details()}"))
            span.end()

        call.add_done_callback(finish)
        return call

    intercept_unary_unary = _intercept
    intercept_unary_stream = _intercept
    intercept_stream_unary = _intercept
    intercept_stream_stream = _intercept


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def _with_metadata(details, metadata) -> _Details:
    return _Details(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


def client_interceptor() -> TracingClientInterceptor:
    """gRPC client interceptor that opens a CLIENT span per call and propagates the trace context."""
    return TracingClientInterceptor()


def in_current_context(fn):
    """Wrap `fn` to run in a copy of the caller's context (trace span, log fields) on any thread.

    Threads of a pool do not inherit contextvars; without this, calls made from them start new
    traces instead of being children of the step's span.
    """
    import contextvars
    import functools

    parent = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return parent.copy().run(fn, *args, **kwargs)

    return run
