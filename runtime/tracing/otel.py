"""The tracer that exports: OpenTelemetry's SDK, batched, over OTLP/HTTP.

Imported by :func:`coterie.runtime.tracing.setup` only when tracing is on.
The provider is this module's own (not the global one): coterie's spans go
where ``tracing:`` says, whatever else in the process uses OpenTelemetry.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from coterie.runtime.tracing import AttributeValue, Carrier, Span, Tracer, current
from coterie.runtime.tracing.genai import ERROR_TYPE, SCHEMA_URL
from coterie.runtime.tracing.settings import TracingSettings

log = logging.getLogger("coterie.tracing")

_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {
    "internal": SpanKind.INTERNAL,
    "client": SpanKind.CLIENT,
    "server": SpanKind.SERVER,
    "producer": SpanKind.PRODUCER,
}


class OtelSpan(Span):
    """One SDK span behind coterie's span interface."""

    recording = True

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        context = span.get_span_context()
        self.trace_id = format(context.trace_id, "032x")
        self.span_id = format(context.span_id, "016x")

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def update(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def event(
        self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None
    ) -> None:
        clean = {k: v for k, v in (attributes or {}).items() if v is not None}
        self.span.add_event(name, clean)

    def fail(self, kind: str, message: str | None = None) -> None:
        self.span.set_attribute(ERROR_TYPE, kind)
        self.span.set_status(Status(StatusCode.ERROR, message or kind))

    def end(self) -> None:
        self.span.end()  # the SDK ignores (and warns of nothing for) a second end

    def carrier(self) -> Carrier:
        out: Carrier = {}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(self.span))
        return out


class OtelTracer(Tracer):
    """Spans of one process, batched and exported to ``settings.endpoint``."""

    enabled = True

    def __init__(
        self,
        settings: TracingSettings,
        *,
        process: str,
        attributes: Mapping[str, str],
        key: Any = None,
        exporter: SpanExporter | None = None,
    ) -> None:
        """``exporter``: where the spans go (default: OTLP/HTTP to the
        settings' endpoint); ``key`` tells :func:`~coterie.runtime.tracing.setup`
        whether a second call changes anything."""
        self.key = key
        self.capture_content = settings.capture_content
        resource = Resource.create(
            {
                "service.name": settings.service_name or "coterie",
                "coterie.process": process,
                "host.name": socket.gethostname(),
                "process.pid": os.getpid(),
                **attributes,
            },
            schema_url=SCHEMA_URL,
        )
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(
                endpoint=settings.endpoint, headers=dict(settings.headers) or None, timeout=10
            )
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=True)
        # Batched: a span costs a queue append on the turn's path; the export
        # runs on the processor's own thread. Half a second between exports
        # keeps what a receiver shows close to live.
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self._tracer = self.provider.get_tracer("coterie", schema_url=SCHEMA_URL)

    def start(
        self,
        name: str,
        *,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        parent: Span | Carrier | None = None,
        kind: str = "internal",
    ) -> Span:
        if parent is None:
            parent = current()
        if isinstance(parent, OtelSpan):
            context = trace.set_span_in_context(parent.span, otel_context.Context())
        elif isinstance(parent, Mapping) and parent:
            context = _PROPAGATOR.extract(dict(parent), context=otel_context.Context())
        else:  # ROOT, or a running span that records nothing: a new trace
            context = otel_context.Context()
        clean = {k: v for k, v in (attributes or {}).items() if v is not None}
        span = self._tracer.start_span(
            name, context=context, kind=_KINDS.get(kind, SpanKind.INTERNAL), attributes=clean
        )
        return OtelSpan(span)

    def flush(self, timeout: float = 5.0) -> bool:
        return bool(self.provider.force_flush(int(timeout * 1000)))

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception:  # boundary: a receiver gone at exit must not fail the exit
            log.warning("tracing: the last spans could not be exported", exc_info=True)


__all__ = ["OtelSpan", "OtelTracer"]
