"""The device-plugin front's metrics: Allocate latency by resource and outcome, registrations
with the kubelet, the devices each ListAndWatch stream shows by health, and open streams.

Allocate's outcomes: `ok`; `invalid` (unknown or no devices, INVALID_ARGUMENT); `refused`
(an edit outside the backend's allowlist, PERMISSION_DENIED); `error` (anything else). The
allowlist's refusals also count in `dra_prepare_rejected_edits_total`, like a DRA prepare's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from shared import metrics

__all__ = ["ALLOCATE_SECONDS", "REGISTRATIONS", "observe_front"]

_meter = metrics.meter("dra.allocation.deviceplugin")
# Allocate is in-memory work (sub-millisecond); the top buckets catch a stalled loop.
_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)

ALLOCATE_SECONDS = _meter.create_histogram(
    "dra_device_plugin_allocate_duration",
    unit="s",
    description="Time to answer one device plugin Allocate call, by resource and outcome.",
    explicit_bucket_boundaries_advisory=_BUCKETS_S,
)
REGISTRATIONS = _meter.create_counter(
    "dra_device_plugin_registrations",
    unit="1",
    description="Register calls to the kubelet's kubelet.sock, by resource and outcome "
    "(ok, error); a kubelet restart makes another round.",
)

DeviceCounts = Callable[[], Mapping[tuple[str, str], int]]
"""(resource, health) -> devices, as ListAndWatch would send them now."""
StreamCounts = Callable[[], Mapping[str, int]]
"""resource -> open ListAndWatch streams."""


_sources: list[tuple[DeviceCounts, StreamCounts]] = []


def observe_front(devices: DeviceCounts, streams: StreamCounts) -> None:
    """Report this front's devices and streams at every scrape (the last front to call, when
    tests run several in one process)."""
    _sources[:] = [(devices, streams)]


def _observe_devices(_: CallbackOptions) -> Iterable[Observation]:
    for devices, _streams in _sources:
        for (resource, health), count in sorted(devices().items()):
            yield Observation(count, {"resource": resource, "health": health})


def _observe_streams(_: CallbackOptions) -> Iterable[Observation]:
    for _devices, streams in _sources:
        for resource, count in sorted(streams().items()):
            yield Observation(count, {"resource": resource})


_meter.create_observable_gauge(
    "dra_device_plugin_devices",
    callbacks=[_observe_devices],
    unit="1",
    description="Devices the front offers the kubelet, by resource and health "
    "(Healthy, Unhealthy), as ListAndWatch sends them.",
)
_meter.create_observable_gauge(
    "dra_device_plugin_streams",
    callbacks=[_observe_streams],
    unit="1",
    description="Open ListAndWatch streams, by resource (1 while the kubelet watches).",
)
