"""Exemplars on the histograms: each bucket names the trace of its last observation in a span.

The OpenTelemetry SDK already keeps them: with its default trace-based exemplar filter, a
histogram measurement made inside a sampled span is offered to the aligned-bucket reservoir,
which holds the last one per bucket and hands it over at the next collection. The Prometheus
exporter (opentelemetry-exporter-prometheus) drops them. `ExemplarMetricReader` is that
exporter's reader, unchanged, writing into a registry of its own; its `ExemplarCollector` serves
the exporter's families as they are (names, labels, `target_info`), each histogram bucket sample
with its exemplar: labels `trace_id` and `span_id` (W3C hex, as in the JSON logs), the observed
value and its time. Only the OpenMetrics format writes exemplars; the Prometheus text format has
no place for them.

An exemplar stays on its bucket until a later one replaces it, as prometheus_client's own
histograms keep theirs: the SDK forgets it at the collection that reports it, and a scrape in
the text format (or by a second Prometheus) must not take it away from the next one.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.exporter.prometheus._mapping import (
    map_unit,
    sanitize_attribute,
    sanitize_full_name,
)
from opentelemetry.sdk.metrics.export import Histogram, Metric, MetricsData
from opentelemetry.util.types import Attributes
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.samples import Exemplar

__all__ = ["SPAN_ID_LABEL", "TRACE_ID_LABEL", "ExemplarCollector", "ExemplarMetricReader"]

TRACE_ID_LABEL = "trace_id"
"""The exemplar label holding the trace ID (32 hex digits); Grafana's Prometheus datasource links
it to Tempo (`exemplarTraceIdDestinations`). The same key as in the JSON logs."""
SPAN_ID_LABEL = "span_id"
"""The exemplar label holding the span ID (16 hex digits)."""

_Series = frozenset[tuple[str, str]]
"""A series' labels as the exporter writes them, without `le` and without empty values."""
_BucketKey = tuple[str, _Series, float]
"""(histogram family name, series, the bucket's upper bound)."""


class ExemplarCollector:
    """A prometheus_client collector: the families of `source`, with the exemplars `observe`d."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source
        self._lock = threading.Lock()  # scrapes run in worker threads, possibly two at once
        self._exemplars: dict[_BucketKey, Exemplar] = {}

    def observe(self, data: MetricsData) -> None:
        """Keep the exemplars of one collection (the latest per bucket)."""
        found = dict(_exemplars_of(data))
        with self._lock:
            self._exemplars.update(found)

    def describe(self) -> list[Family]:
        # Registering would otherwise collect once to learn the names; these are the exporter's.
        return []

    def collect(self) -> Iterator[Family]:
        # Collecting the source runs the reader's collection, hence `observe`, first.
        families = list(self.source.collect())
        with self._lock:
            exemplars = dict(self._exemplars)
        for family in families:
            yield _with_exemplars(family, exemplars) if family.type == "histogram" else family


class ExemplarMetricReader(PrometheusMetricReader):
    """The Prometheus exporter's reader, its families served with exemplars in `registry`."""

    def __init__(
        self, *, scope_info_enabled: bool = True, registry: CollectorRegistry = REGISTRY
    ) -> None:
        self.collector = ExemplarCollector(CollectorRegistry(auto_describe=False))
        self._served_in = registry
        super().__init__(scope_info_enabled=scope_info_enabled, registry=self.collector.source)
        registry.register(self.collector)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        if metrics_data is not None:
            self.collector.observe(metrics_data)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._served_in.unregister(self.collector)
        super().shutdown(timeout_millis, **kwargs)


def _exemplars_of(data: MetricsData) -> Iterator[tuple[_BucketKey, Exemplar]]:
    """The exemplars with a trace of every histogram point, keyed by the bucket they fell in."""
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if not isinstance(metric.data, Histogram):
                    continue
                name = _family_name(metric)
                for point in metric.data.data_points:
                    series = _series(point.attributes)
                    for exemplar in point.exemplars:
                        # Outside a span (OTEL_METRICS_EXEMPLAR_FILTER=always_on): no trace.
                        if exemplar.trace_id is None or exemplar.span_id is None:
                            continue
                        bound = _upper_bound(exemplar.value, point.explicit_bounds)
                        labels = {
                            TRACE_ID_LABEL: format(exemplar.trace_id, "032x"),
                            SPAN_ID_LABEL: format(exemplar.span_id, "016x"),
                        }
                        yield (
                            (name, series, bound),
                            Exemplar(labels, exemplar.value, exemplar.time_unix_nano / 1e9),
                        )


def _family_name(metric: Metric) -> str:
    """The family name the exporter gives `metric` (sanitized, with the unit's suffix)."""
    unit = map_unit(metric.unit or "")
    return HistogramMetricFamily(sanitize_full_name(metric.name), "", unit=unit).name


def _series(attributes: Attributes) -> _Series:
    """A point's attributes as the exporter writes them as labels (its `_check_value`)."""
    labels = {
        sanitize_attribute(key): value if isinstance(value, str) else json.dumps(value, default=str)
        for key, value in (attributes or {}).items()
    }
    return frozenset((key, value) for key, value in labels.items() if value != "")


def _upper_bound(value: float, bounds: Sequence[float]) -> float:
    """The `le` of the bucket `value` is counted in (the SDK's rule: value <= bound)."""
    return next((bound for bound in bounds if value <= bound), float("inf"))


def _with_exemplars(family: Family, exemplars: dict[_BucketKey, Exemplar]) -> Family:
    """A copy of the histogram `family` whose bucket samples carry their exemplars."""
    bucket = f"{family.name}_bucket"
    samples = []
    for sample in family.samples:
        if sample.name == bucket:
            series = frozenset(
                (key, value) for key, value in sample.labels.items() if key != "le" and value
            )
            found = exemplars.get((family.name, series, float(sample.labels["le"])))
            if found is not None:
                sample = sample._replace(exemplar=found)
        samples.append(sample)
    served = copy.copy(family)
    served.samples = samples
    return served
