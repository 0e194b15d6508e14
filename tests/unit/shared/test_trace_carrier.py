"""Trace context on the bus: only the W3C headers are carried, bounded; a reader's span is a
child of a live writer's span and linked to a replayed one's."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import telemetry

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_only_bounded_w3c_headers_are_carried() -> None:
    headers = {"traceparent": PARENT, "Nats-Msg-Id": "x", "tracestate": "a=" + "b" * 600}
    assert telemetry.carried(headers) == (("traceparent", PARENT),)
    assert telemetry.carried(None) == ()


def test_a_live_change_is_a_child_and_a_replayed_one_a_link() -> None:
    provider, exporter = _tracer()
    tracer = provider.get_tracer(__name__)
    carrier = (("traceparent", PARENT),)
    with telemetry.continued(tracer, "live", carrier):
        pass
    with telemetry.continued(tracer, "replayed", carrier, linked=True):
        pass
    live, replayed = exporter.get_finished_spans()
    assert live.parent is not None
    assert format(live.context.trace_id, "032x") == PARENT[3:35]
    assert replayed.parent is None
    assert format(replayed.links[0].context.span_id, "016x") == PARENT[36:52]


def test_no_span_without_a_trace_or_with_garbage() -> None:
    provider, exporter = _tracer()
    tracer = provider.get_tracer(__name__)
    for carrier in ((), (("traceparent", "not-a-trace"),)):
        with telemetry.continued(tracer, "quiet", carrier) as span:
            assert span is None
    assert exporter.get_finished_spans() == ()
