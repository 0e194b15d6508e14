"""OpenTelemetry metrics for every agent, read in Prometheus text format from the ops server.

One MeterProvider per process (like the tracer provider), feeding prometheus_client's registry;
instruments are created where the thing they count happens, from `meter(__name__)`. Metric
names are `dra_<what>_<unit>`; labels are low-cardinality (outcome, verb; never a UID). Who
reports a series (service, version, node, driver) is in the agent's resource, exported once as
Prometheus' `target_info` (join on `job`/`instance`), plus `dra_build_info` with the version.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from shared.resource import agent_resource, build_version

__all__ = ["CONTENT_TYPE", "configure", "meter", "observe_asyncio_tasks", "render"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_provider: MeterProvider | None = None
_observed_loop: asyncio.AbstractEventLoop | None = None


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
            metric_readers=[PrometheusMetricReader(scope_info_enabled=False)],
        )
        metrics.set_meter_provider(_provider)
        _report_build_info(service)
    return _provider


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


def render() -> bytes:
    """Every metric of the process in Prometheus text exposition format."""
    return generate_latest(REGISTRY)
