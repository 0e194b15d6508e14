"""The health agent's metrics: devices by health, alerts published by status, and
inventories quarantined by the sanity rules.
Taint rule writes are counted per verb by the shared kube client (`dra_kube_requests`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from services.health.policy import DeviceState, Health
from shared import metrics

__all__ = ["ALERTS_PUBLISHED", "INVENTORY_REJECTED", "observe_device_health"]

_meter = metrics.meter("dra.health")

ALERTS_PUBLISHED = _meter.create_counter(
    "dra_alerts_published", unit="1", description="Ops alerts published, by status."
)
INVENTORY_REJECTED = _meter.create_counter(
    "dra_inventory_rejected",
    unit="1",
    description="Inventories of this node quarantined by the sanity rules (the last good one "
    "stayed in force), by reason: empty, generation_backwards, generation_reused.",
)


def observe_device_health(states: Callable[[], dict[str, DeviceState]]) -> None:
    """Report how many devices are in each health state at every scrape."""

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        counts = Counter(state.health for state in states().values())
        for health in Health:
            yield Observation(counts.get(health, 0), {"health": health.value})

    _meter.create_observable_gauge(
        "dra_devices", callbacks=[observe], unit="1", description="Devices by health state."
    )
