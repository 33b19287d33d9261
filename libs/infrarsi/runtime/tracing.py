"""OpenTelemetry set-up shared by every process (services, CLI, launcher, probe).

Owns the tracer provider and the W3C trace-context hand-off through NATS headers, so that one trial is
one trace across services. The exporter follows the standard ``OTEL_*`` variables:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set → OTLP over HTTP;
- else ``INFRARSI_TRACE_FILE`` set → one JSON span per line appended to that file;
- else ``OTEL_TRACES_EXPORTER=console`` → spans printed to stderr;
- else spans are created (their ids still reach the logs) but not exported.
``OTEL_SDK_DISABLED=true`` turns tracing off altogether.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
_configured = False
_lock = threading.Lock()


class JsonlSpanExporter(SpanExporter):
    """Appends each finished span as one JSON line: for tests and for hosts without a collector."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            if ctx is None:  # only a span that was never started has none
                continue
            parent = span.parent
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_span_id": format(parent.span_id, "016x") if parent else None,
                        "service": span.resource.attributes.get("service.name"),
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "attributes": dict(span.attributes or {}),
                    }
                )
            )
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def setup_tracing(service_name: str, trace_file: Path | str | None = None) -> None:
    """Install the process-wide tracer provider once; later calls are no-ops. ``trace_file``
    (``INFRARSI_TRACE_FILE``): write spans there as JSON lines when no OTLP endpoint is configured."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif trace_file is not None:
            provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(str(trace_file))))
        elif os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)


def shutdown_tracing() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def tracer() -> trace.Tracer:
    return trace.get_tracer("infrarsi")


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current span's ``traceparent`` (ASCII) to ``headers`` and return them."""
    _propagator.inject(headers)
    return headers


def traceparent() -> str | None:
    """The current context as a W3C ``traceparent`` string, for a child process's environment."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def span_from(headers: Mapping[str, str] | None, name: str, **attributes: str | int | float) -> Iterator[trace.Span]:
    """A span that is a child of the context carried in ``headers`` (a message's, or the environment's)."""
    parent = _propagator.extract(dict(headers or {}))
    token = otel_context.attach(parent)
    try:
        with tracer().start_as_current_span(name, attributes=attributes) as span:
            yield span
    finally:
        otel_context.detach(token)


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None
