"""OpenTelemetry wiring: the tracer provider, and trace context over NATS headers and gRPC.

A provider is always installed, so trace IDs reach the logs; spans are exported over OTLP/gRPC
only when an endpoint is configured. This module is the only one that touches propagation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from shared.config import TelemetrySettings

__all__ = [
    "configure",
    "current_trace_id",
    "extract",
    "extract_grpc_metadata",
    "inject",
    "shutdown",
    "tracer",
]

_provider: TracerProvider | None = None


def configure(
    settings: TelemetrySettings,
    *,
    service: str,
    extra_processors: Iterable[SpanProcessor] = (),
) -> TracerProvider:
    """Install the process-wide tracer provider once; later calls return the first one."""
    global _provider
    if _provider is not None:
        for processor in extra_processors:
            _provider.add_span_processor(processor)
        return _provider
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "service.namespace": "dra-suite"}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint, insecure=True))
        )
    for processor in extra_processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown() -> None:
    """Flush and stop exporting; safe to call when nothing was configured."""
    if _provider is not None:
        _provider.force_flush(timeout_millis=2000)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(carrier: dict[str, str]) -> dict[str, str]:
    """Write the current trace context into `carrier` (NATS headers) and return it."""
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    """Trace context from NATS headers; an empty context when there is none."""
    return propagate.extract(dict(carrier or {}))


def extract_grpc_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """Trace context from gRPC invocation metadata (the kubelet sends none today; tests do)."""
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    return propagate.extract(carrier)


def current_trace_id() -> str:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""
