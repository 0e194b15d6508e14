"""OpenTelemetry wiring: the tracer provider, and trace context over NATS headers and gRPC.

A provider is always installed, so trace IDs reach the logs; spans are exported over OTLP/gRPC
only when an endpoint is configured (`--otlp-endpoint`, or the SDK's standard
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`). Everything else the OpenTelemetry SDK reads from its
environment (TLS certificates, headers, compression, timeout, sampler, resource attributes,
`OTEL_SDK_DISABLED`) is honoured as the SDK documents it. This module is the only one that
touches propagation.

Every message and KV record on the bus carries the writer's W3C `traceparent`/`tracestate` in
its NATS headers; a reader continues it with `continued()`. A header is only ever a trace link:
readers check every message exactly as they would without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanContext

from shared.config import TelemetrySettings
from shared.resource import agent_resource

__all__ = [
    "TRACE_HEADERS",
    "Carrier",
    "carried",
    "configure",
    "continued",
    "current_trace_id",
    "export_endpoint",
    "extract",
    "extract_grpc_metadata",
    "inject",
    "remote_span",
    "shutdown",
    "span_exporter",
    "tracer",
]

TRACE_HEADERS = ("traceparent", "tracestate")
# W3C caps tracestate at 32 members of up to 256 characters; a longer header is not a trace.
_MAX_HEADER_CHARS = 512
Carrier = tuple[tuple[str, str], ...]
"""The trace-context headers of one message, in a hashable form that dataclasses can hold."""

_provider: TracerProvider | None = None
_NO_ENV: Mapping[str, str] = MappingProxyType({})


def configure(
    settings: TelemetrySettings,
    *,
    service: str,
    node: str = "",
    driver: str = "",
    environ: Mapping[str, str] = _NO_ENV,
    extra_processors: Iterable[SpanProcessor] = (),
) -> TracerProvider:
    """Install the process-wide tracer provider once; later calls return the first one.

    `environ` is the process environment (the agents' `cli.py` passes `os.environ`): it decides
    whether spans are exported at all; the exporter itself reads the rest of the SDK's variables.
    """
    global _provider
    if _provider is not None:
        for processor in extra_processors:
            _provider.add_span_processor(processor)
        return _provider
    provider = TracerProvider(
        resource=agent_resource(service=service, node=node, driver=driver, environ=environ),
        sampler=_sampler(settings, environ),
    )
    exporter = span_exporter(settings, environ)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in extra_processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def span_exporter(settings: TelemetrySettings, environ: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP/gRPC exporter the settings and the environment ask for; None: no export."""
    endpoint = export_endpoint(settings, environ)
    if endpoint is None:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # insecure=None lets the SDK decide as it documents: https:// means TLS (with
    # OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE or the system CAs, and a client certificate from
    # OTEL_EXPORTER_OTLP_CLIENT_*), http:// means plaintext, and a bare host:port follows
    # OTEL_EXPORTER_OTLP_INSECURE (TLS unless it is true).
    return OTLPSpanExporter(endpoint=endpoint or None, insecure=None)


def export_endpoint(settings: TelemetrySettings, environ: Mapping[str, str]) -> str | None:
    """Where spans go: the flag, else "" (the SDK reads its own variable), else None: no export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    if settings.otlp_endpoint:
        return settings.otlp_endpoint
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return ""
    return None


def _sampler(settings: TelemetrySettings, environ: Mapping[str, str]) -> Sampler | None:
    """Our ratio, unless the standard OTEL_TRACES_SAMPLER is set (None: the SDK reads it)."""
    if environ.get("OTEL_TRACES_SAMPLER"):
        return None
    return ParentBased(TraceIdRatioBased(settings.sample_ratio))


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


def extract(carrier: Mapping[str, str] | Carrier | None) -> otel_context.Context:
    """Trace context from NATS headers; an empty context when there is none."""
    return propagate.extract(_as_dict(carrier))


def _as_dict(carrier: Mapping[str, str] | Carrier | None) -> dict[str, str]:
    if isinstance(carrier, tuple):
        return dict(carrier)
    return dict(carrier or {})


def extract_grpc_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """Trace context from gRPC invocation metadata (the kubelet sends none today; tests do)."""
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    return propagate.extract(carrier)


def current_trace_id() -> str:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def carried(headers: Mapping[str, str] | None) -> Carrier:
    """Only the W3C trace-context headers of a message, each bounded in length. Everything
    else a sender put in its headers is left behind: a header links a trace, nothing more."""
    if not headers:
        return ()
    return tuple(
        (name, value)
        for name in TRACE_HEADERS
        if isinstance(value := headers.get(name), str) and 0 < len(value) <= _MAX_HEADER_CHARS
    )


def remote_span(carrier: Mapping[str, str] | Carrier | None) -> SpanContext | None:
    """The sender's span that `carrier` names; None when it names none (or garbage)."""
    context = trace.get_current_span(extract(carrier)).get_span_context()
    return context if context.is_valid else None


@contextlib.contextmanager
def continued(
    tracer: trace.Tracer,
    name: str,
    carrier: Carrier,
    *,
    linked: bool = False,
    attributes: Mapping[str, str | int | bool] | None = None,
) -> Iterator[Span | None]:
    """A reader's span for a message that carries a trace: a child of the sender's span, or
    (`linked`) a new trace's root with a link to it. A message without one gets no span, so
    the periodic refreshes on the bus do not flood the backend with one-span traces."""
    sender = remote_span(carrier)
    if sender is None:
        yield None
        return
    parent = otel_context.Context() if linked else extract(carrier)
    links = [Link(sender)] if linked else None
    with tracer.start_as_current_span(
        name, context=parent, links=links, attributes=dict(attributes or {})
    ) as span:
        yield span
