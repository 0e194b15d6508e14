"""The discovery agent's metrics: failed backend scans, whether the backend is failing now, and
inventories put back over a foreign value of the node's key. Exposed at the agent's /metrics
(shared/metrics.py)."""

from __future__ import annotations

from shared import metrics

__all__ = ["INVENTORY_REASSERTED", "SCANS_FAILED", "SCAN_FAILING"]

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
