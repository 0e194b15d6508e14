"""OpenTelemetry metrics for every agent, read by Prometheus from the ops server.

One MeterProvider per process (like the tracer provider), feeding prometheus_client's registry
through the OpenTelemetry Prometheus exporter; instruments are created where the thing they
count happens, from `meter(__name__)`. Metric names are `dra_<what>_<unit>`; labels are
low-cardinality (outcome, verb; never a UID). Who reports a series (service, version, node,
driver) is in the agent's resource, exported once as Prometheus' `target_info` (join on
`job`/`instance`), plus `dra_build_info` with the version.

A counter exists only from its first event unless it is declared with `export_at_zero`: then its
series (per known label set) is exported at 0 from the start, so `rate()`/`increase()` see the
first event and the dashboard's and the alert rules' queries find the series on a quiet node.

A histogram observed inside a sampled span carries, on the bucket it fell in, an exemplar naming
that span's trace (shared/metrics_exemplars.py). `exposition` writes them in the OpenMetrics
format, which a scraper asks for in its `Accept` header (Prometheus does); any other scraper gets
the Prometheus text format of `render`, without exemplars.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Observation, UpDownCounter
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE

from shared.metrics_exemplars import ExemplarMetricReader
from shared.resource import agent_resource, build_version

__all__ = [
    "CONTENT_TYPE",
    "configure",
    "export_at_zero",
    "exposition",
    "meter",
    "observe_asyncio_tasks",
    "observe_nats_connection",
    "render",
    "report_ready",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_provider: MeterProvider | None = None
_observed_loop: asyncio.AbstractEventLoop | None = None
_nats_connected: Callable[[], bool] | None = None
# Zero-valued series declared before `configure`: a measurement on an instrument made before the
# provider exists is dropped, so they are recorded when it is installed (one entry per series).
_pending_zeros: dict[
    tuple[int, frozenset[tuple[str, str]]], tuple[Counter | UpDownCounter, Mapping[str, str]]
] = {}


def configure(
    *,
    service: str,
    node: str = "",
    driver: str = "",
    environ: Mapping[str, str] = MappingProxyType({}),
) -> MeterProvider:
    """Install the process-wide meter provider once; later calls return the first one."""
    global _provider
    if _provider is None:
        _provider = MeterProvider(
            resource=agent_resource(service=service, node=node, driver=driver, environ=environ),
            # Scope labels would put the Python module name on every series; dashboards need none.
            metric_readers=[ExemplarMetricReader(scope_info_enabled=False)],
        )
        metrics.set_meter_provider(_provider)
        _report_build_info(service)
        for instrument, attributes in _pending_zeros.values():
            instrument.add(0, attributes)
        _pending_zeros.clear()
    return _provider


def export_at_zero(instrument: Counter | UpDownCounter, *attributes: Mapping[str, str]) -> None:
    """Export `instrument` at 0 from the start: one series per label set, or the unlabelled one.

    Only label values known in advance belong here (reasons, statuses, the node's backend);
    a value first seen at run time still starts its own series at its first event.
    """
    for labels in attributes or ({},):
        if _provider is None:
            key = (id(instrument), frozenset(labels.items()))
            _pending_zeros[key] = (instrument, dict(labels))
        else:
            instrument.add(0, labels)


def _report_build_info(service: str) -> None:
    """`dra_build_info{version, python, service} 1`: which build runs where, for dashboards."""
    labels = {"version": build_version(), "python": platform.python_version(), "service": service}

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1, labels)

    meter(__name__).create_observable_gauge(
        "dra_build_info",
        callbacks=[observe],
        unit="1",
        description="Always 1; the labels name the running build.",
    )


def meter(name: str) -> metrics.Meter:
    """A meter for one module; instruments made before `configure` still report after it."""
    return metrics.get_meter(name)


def observe_asyncio_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Report the unfinished tasks of `loop` (the agent's event loop) as `dra_asyncio_tasks`.

    A task leak shows as a gauge that keeps climbing under steady load. The gauge is made
    once per process; a later call points it at a new loop (tests run one loop per test).
    """
    global _observed_loop
    first = _observed_loop is None
    _observed_loop = loop
    if first:
        meter(__name__).create_observable_gauge(
            "dra_asyncio_tasks",
            callbacks=[_observe_tasks],
            unit="1",
            description="Unfinished asyncio tasks of the agent's event loop.",
        )


def _observe_tasks(_: CallbackOptions) -> Iterable[Observation]:
    # Runs in the scrape's worker thread: all_tasks(loop) is safe to call from another thread
    # (it copies the task set, retrying while the loop's thread changes it).
    loop = _observed_loop
    if loop is not None and not loop.is_closed():
        yield Observation(len(asyncio.all_tasks(loop)))


def observe_nats_connection(connected: Callable[[], bool]) -> None:
    """Report `connected()` as the `dra_nats_connected` gauge (1 connected, 0 not).

    The agent's bus calls this when its connection task starts; the gauge is made once per
    process and a later call points it at the newer connection (tests run many in one process).
    """
    global _nats_connected
    first = _nats_connected is None
    _nats_connected = connected
    if first:
        meter(__name__).create_observable_gauge(
            "dra_nats_connected",
            callbacks=[_observe_nats_connected],
            unit="1",
            description="1 while the agent's NATS connection is up, 0 while it is lost.",
        )


def _observe_nats_connected(_: CallbackOptions) -> Iterable[Observation]:
    # A read of an asyncio.Event's flag from the scrape's thread: a plain attribute read.
    connected = _nats_connected
    if connected is not None:
        yield Observation(1 if connected() else 0)


_ready = meter(__name__).create_gauge(
    "dra_agent_ready",
    unit="1",
    description="1 while the agent's /readyz answers 200, 0 while it answers 503; set at every "
    "scrape of /metrics.",
)


def report_ready(ready: bool) -> None:
    """Record the agent's readiness as `dra_agent_ready` (the ops server, before each scrape)."""
    _ready.set(1 if ready else 0)


def render() -> bytes:
    """Every metric of the process in Prometheus text exposition format (no exemplars)."""
    return generate_latest(REGISTRY)


def exposition(accept: str) -> tuple[bytes, str]:
    """Every metric of the process and its content type, in the format a scraper's `Accept`
    header asks for, negotiated as prometheus_client does: OpenMetrics 1.0 with the exemplars
    when it accepts `application/openmetrics-text`, else `render()` with `CONTENT_TYPE`."""
    encoder, content_type = choose_encoder(accept)
    if content_type.split(";")[0] != OPENMETRICS_TYPE.split(";")[0]:
        return render(), CONTENT_TYPE
    return encoder(REGISTRY), content_type
