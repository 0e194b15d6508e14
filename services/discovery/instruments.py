"""The discovery agent's metrics: failed backend scans, whether the backend is failing now,
inventories put back over a foreign value of the node's key, devices left out of the slices and
slices the API server rejected. Exposed at the agent's /metrics (shared/metrics.py). The
counters are exported at 0 from the start for the label values known in advance (reasons, 422,
the node's backend once the scan reporter knows it), so dashboards and alerts find them."""

from __future__ import annotations

from services.discovery.layout import DUPLICATE, INVALID, OVER_LIMIT
from services.discovery.unpublished import WITHHELD
from shared import metrics

__all__ = [
    "DEVICES_DROPPED",
    "INVENTORY_REASSERTED",
    "SCANS_FAILED",
    "SCAN_FAILING",
    "SLICES_REJECTED",
    "export_scans_at_zero",
]

_meter = metrics.meter("dra.discovery")

SCANS_FAILED = _meter.create_counter(
    "dra_backend_scans_failed",
    unit="1",
    description="Backend scans that failed (the last good inventory stayed published), by backend.",
)
SCAN_FAILING = _meter.create_up_down_counter(
    "dra_backend_scan_failing",
    unit="1",
    description="1 while the backend's scans fail (from the first failure to the next success).",
)
INVENTORY_REASSERTED = _meter.create_counter(
    "dra_inventory_reasserted",
    unit="1",
    description="Times the node's inventory key held another value than the last published "
    "inventory (forged, damaged or deleted) and it was put back, by reason.",
)
DEVICES_DROPPED = _meter.create_counter(
    "dra_slice_devices_dropped",
    unit="1",
    description="Devices of the inventory left out of the ResourceSlices by the pre-publish "
    "check (invalid, duplicate, over_limit) or the server's rules (withheld), by reason; a "
    "device counts once per time it is dropped, not once per sync.",
)
SLICES_REJECTED = _meter.create_counter(
    "dra_slice_rejections",
    unit="1",
    description="ResourceSlice writes the API server rejected (e.g. 422 Invalid), by HTTP status.",
)

metrics.export_at_zero(
    INVENTORY_REASSERTED, *({"reason": r} for r in ("differs", "unreadable", "deleted"))
)
metrics.export_at_zero(
    DEVICES_DROPPED, *({"reason": r} for r in (INVALID, DUPLICATE, OVER_LIMIT, WITHHELD))
)
# 422 Invalid is the rejection a slice write gets; other statuses start at their first one.
metrics.export_at_zero(SLICES_REJECTED, {"status": "422"})


def export_scans_at_zero(backend: str) -> None:
    """`dra_backend_scans_failed_total` and `dra_backend_scan_failing` of `backend` at 0."""
    metrics.export_at_zero(SCANS_FAILED, {"backend": backend})
    metrics.export_at_zero(SCAN_FAILING, {"backend": backend})
