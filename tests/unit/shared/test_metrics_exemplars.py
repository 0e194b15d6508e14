"""Exemplars on the histograms: a histogram observed inside a sampled span names that span's
trace on the bucket it fell in, in OpenMetrics only; everything else is the exporter's output."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanContext, Tracer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics import parser
from prometheus_client.samples import Sample

from shared import metrics
from shared.metrics_exemplars import SPAN_ID_LABEL, TRACE_ID_LABEL, ExemplarMetricReader
from shared.opsserver import OpsServer

BUCKETS = (0.01, 0.1, 1.0, 10.0)
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def provider(registry: CollectorRegistry) -> Iterator[MeterProvider]:
    reader = ExemplarMetricReader(scope_info_enabled=False, registry=registry)
    provider = MeterProvider(resource=Resource.create({"service.name": "test"}),
                             metric_readers=[reader])  # fmt: skip
    yield provider
    provider.shutdown()


@pytest.fixture
def tracer() -> Tracer:
    return TracerProvider().get_tracer("test")


def _openmetrics(registry: CollectorRegistry) -> str:
    text: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
    return text.decode()


def _ids(context: SpanContext) -> dict[str, str]:
    return {
        TRACE_ID_LABEL: format(context.trace_id, "032x"),
        SPAN_ID_LABEL: format(context.span_id, "016x"),
    }


def _families(text: str) -> list[Metric]:
    """Every family of an OpenMetrics exposition; raises on one that breaks the format."""
    return list(parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def _only(text: str, family: str) -> str:
    """The lines of one family of a whole process's exposition, as an exposition of its own
    (other tests of this process may have made instruments that share a name)."""
    kept = [
        line
        for line in text.splitlines(keepends=True)
        if line.startswith(f"{family}_") or line.split(" ")[2:3] == [family]  # samples, # lines
    ]
    return "".join(kept) + "# EOF\n"


def _buckets(text: str, family: str) -> list[Sample]:
    (found,) = [f for f in _families(text) if f.name == family]
    return [s for s in found.samples if s.name == f"{family}_bucket"]


def _exemplars(text: str, family: str) -> dict[str, dict[str, str]]:
    """`le` -> the exemplar's labels, of every bucket with one (labels other than `le` aside)."""
    return {s.labels["le"]: s.exemplar.labels for s in _buckets(text, family) if s.exemplar}


def test_a_histogram_observed_in_a_span_names_its_trace_on_its_bucket_in_openmetrics_only(
    provider: MeterProvider, registry: CollectorRegistry, tracer: Tracer
) -> None:
    histogram = provider.get_meter("test").create_histogram(
        "dra_step_duration", unit="s", explicit_bucket_boundaries_advisory=BUCKETS
    )
    with tracer.start_as_current_span("step") as span:
        histogram.record(0.5, {"outcome": "ok"})
    histogram.record(5.0, {"outcome": "ok"})  # outside a span: no exemplar

    text = _openmetrics(registry)
    assert _exemplars(text, "dra_step_duration_seconds") == {"1.0": _ids(span.get_span_context())}
    (exemplar,) = [s.exemplar for s in _buckets(text, "dra_step_duration_seconds") if s.exemplar]
    assert exemplar.value == 0.5
    assert exemplar.timestamp is not None

    classic = generate_latest(registry).decode()
    assert 'dra_step_duration_seconds_bucket{le="1.0",outcome="ok"} 1.0\n' in classic
    assert "trace_id" not in classic
    assert " # {" not in classic


def test_each_bucket_keeps_its_last_traced_observation_across_scrapes(
    provider: MeterProvider, registry: CollectorRegistry, tracer: Tracer
) -> None:
    histogram = provider.get_meter("test").create_histogram(
        "dra_step_duration", unit="s", explicit_bucket_boundaries_advisory=BUCKETS
    )
    with tracer.start_as_current_span("first") as first:
        histogram.record(0.005, {"outcome": "ok"})
    with tracer.start_as_current_span("error") as error:
        histogram.record(0.005, {"outcome": "error"})
    generate_latest(registry)  # a scrape in the text format takes nothing away
    text = _openmetrics(registry)
    found = {
        (s.labels["outcome"], s.labels["le"]): s.exemplar.labels
        for s in _buckets(text, "dra_step_duration_seconds")
        if s.exemplar
    }
    assert found == {
        ("ok", "0.01"): _ids(first.get_span_context()),
        ("error", "0.01"): _ids(error.get_span_context()),
    }

    with tracer.start_as_current_span("second") as second:
        histogram.record(0.001, {"outcome": "ok"})
        histogram.record(20.0, {"outcome": "ok"})
    text = _openmetrics(registry)
    ok = {
        s.labels["le"]: s.exemplar.labels
        for s in _buckets(text, "dra_step_duration_seconds")
        if s.exemplar and s.labels["outcome"] == "ok"
    }
    assert ok == {"0.01": _ids(second.get_span_context()), "+Inf": _ids(second.get_span_context())}


def test_an_unsampled_span_leaves_no_exemplar(
    provider: MeterProvider, registry: CollectorRegistry
) -> None:
    histogram = provider.get_meter("test").create_histogram(
        "dra_step_duration", unit="s", explicit_bucket_boundaries_advisory=BUCKETS
    )
    with TracerProvider(sampler=ALWAYS_OFF).get_tracer("test").start_as_current_span("step"):
        histogram.record(0.5)
    text = _openmetrics(registry)
    assert _exemplars(text, "dra_step_duration_seconds") == {}


def test_the_text_format_is_the_exporters_own_for_every_kind_of_instrument(
    registry: CollectorRegistry, tracer: Tracer
) -> None:
    plain = CollectorRegistry()
    provider = MeterProvider(
        resource=Resource.create({"service.name": "test", "k8s.node.name": "node-a"}),
        metric_readers=[
            ExemplarMetricReader(scope_info_enabled=False, registry=registry),
            PrometheusMetricReader(scope_info_enabled=False, registry=plain),
        ],
    )
    try:
        meter = provider.get_meter("test")
        meter.create_counter("dra_events", unit="1").add(0, {"reason": "empty"})
        meter.create_up_down_counter("dra_open", unit="1").add(2)
        meter.create_gauge("dra_ready", unit="1").set(1)
        histogram = meter.create_histogram(
            "dra_step_duration", unit="s", explicit_bucket_boundaries_advisory=BUCKETS
        )
        with tracer.start_as_current_span("step"):
            histogram.record(0.2, {"outcome": "ok", "retried": True, "attempt": 2})
        ours, theirs = generate_latest(registry), generate_latest(plain)
        assert ours == theirs
        assert b"target_info{" in ours
        # The exemplar found its series although two labels are not strings.
        text = _openmetrics(registry)
        assert list(_exemplars(text, "dra_step_duration_seconds")) == ["1.0"]
    finally:
        provider.shutdown()


async def _get(port: int, accept: str | None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept is not None else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response,
    ):
        assert response.status == 200
        return response.headers["Content-Type"], await response.text()


async def test_the_ops_server_answers_openmetrics_to_prometheus_and_text_to_others(
    tracer: Tracer,
) -> None:
    metrics.configure(service="test")
    histogram = metrics.meter("test.exemplars").create_histogram(
        "dra_test_exemplar_duration", unit="s", explicit_bucket_boundaries_advisory=BUCKETS
    )
    with tracer.start_as_current_span("step") as span:
        histogram.record(0.05)
    server = OpsServer(host="127.0.0.1", port=0, ready=asyncio.Event())
    await server.start()
    try:
        content_type, text = await _get(server.bound_port, PROMETHEUS_ACCEPT)
        assert content_type.startswith("application/openmetrics-text; version=1.0.0")
        family = "dra_test_exemplar_duration_seconds"
        assert _exemplars(_only(text, family), family) == {"0.1": _ids(span.get_span_context())}
        assert "dra_agent_ready 0.0" in text
        assert text.endswith("# EOF\n")
        for accept in (None, "text/plain;version=0.0.4", "*/*"):
            content_type, text = await _get(server.bound_port, accept)
            assert content_type == metrics.CONTENT_TYPE, accept
            assert "# TYPE target_info gauge\n" in text, accept  # `render()`'s format
            assert 'dra_test_exemplar_duration_seconds_bucket{le="0.1"} 1.0\n' in text
            assert "# EOF" not in text
            assert "trace_id" not in text
    finally:
        await server.stop()


@pytest.mark.parametrize("agent", ["discovery", "allocation", "health", "natsauth"])
def test_every_agents_metrics_are_valid_openmetrics(agent: str) -> None:
    # What Prometheus parses when it scrapes: the agent's own instruments, in a fresh process.
    script = (
        f"from services.{agent} import cli\n"
        "from shared import metrics\n"
        f"metrics.configure(service='dra-{agent}', node='node-a', driver='sim.dra-suite.io')\n"
        "body, _ = metrics.exposition('application/openmetrics-text;version=1.0.0')\n"
        "print(body.decode(), end='')\n"
    )
    text = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    names = [family.name for family in _families(text)]
    assert {"target", "dra_build_info"} <= set(names), names
