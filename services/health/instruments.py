"""The health agent's metrics: devices by health, tainted devices by effect, alerts published
by status, inventories quarantined by the sanity rules and health records put back after another
writer replaced or removed them (the counters exported at 0 from the start for their known label
values). Taint rule writes are counted per verb by the shared kube
client (`dra_kube_requests`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from services.health.policy import DeviceState, Health
from shared import inventory_sanity, metrics
from shared.bus import ownkeys

__all__ = [
    "ALERTS_PUBLISHED",
    "HEALTH_RECORDS_REASSERTED",
    "INVENTORY_REJECTED",
    "TAINT_EFFECTS",
    "observe_device_health",
]

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
metrics.export_at_zero(ALERTS_PUBLISHED, {"status": "raised"}, {"status": "resolved"})
# The health agent does not refuse a change of backend (`same_backend` is off for it).
metrics.export_at_zero(
    INVENTORY_REJECTED,
    *({"reason": r} for r in inventory_sanity.REASONS if r != "backend_changed"),
)
HEALTH_RECORDS_REASSERTED = _meter.create_counter(
    "dra_health_records_reasserted",
    unit="1",
    description="Health records of this node put back at once after another writer emptied, "
    "replaced or deleted them, by reason: differs, deleted, rejected (refused by the record "
    "check).",
)
metrics.export_at_zero(HEALTH_RECORDS_REASSERTED, *({"reason": r} for r in ownkeys.REASONS))
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
"""The effects a device taint can have; `dra_tainted_devices` reports each, 0 included."""


def observe_device_health(states: Callable[[], dict[str, DeviceState]]) -> None:
    """Report how many devices are in each health state, and how many carry a taint of each
    effect, at every scrape."""

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        counts = Counter(state.health for state in states().values())
        for health in Health:
            # `passthrough` only while some device is (docs/vfio.md): the other three at 0 too.
            if health is not Health.PASSTHROUGH or counts.get(health):
                yield Observation(counts.get(health, 0), {"health": health.value})

    def observe_taints(_: CallbackOptions) -> Iterable[Observation]:
        effects = Counter(s.taint.effect for s in states().values() if s.taint is not None)
        for effect in (*TAINT_EFFECTS, *sorted(set(effects) - set(TAINT_EFFECTS))):
            yield Observation(effects.get(effect, 0), {"effect": effect})

    _meter.create_observable_gauge(
        "dra_devices", callbacks=[observe], unit="1", description="Devices by health state."
    )
    _meter.create_observable_gauge(
        "dra_tainted_devices",
        callbacks=[observe_taints],
        unit="1",
        description="Devices the health policy taints now (a fault or unmonitored taint; "
        "manual drains not included), by the taint's effect.",
    )
